package clock

import (
	"context"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	if !Sleep(t.Context(), time.Millisecond) {
		t.Fatal("a sleep with a live context reported it ended")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("a sleep whose context had ended reported it live")
	}
}
