package testenv

import (
	"strings"
	"testing"
	"time"
)

// parked blocks until release is closed: a goroutine of fenced's code.
func parked(release <-chan struct{}, done chan<- struct{}) {
	<-release
	close(done)
}

// The check sees a goroutine running fenced's code, not its own caller's,
// and no longer once it has ended; a failed run's code is passed on
// without waiting.
func TestOwnGoroutines(t *testing.T) {
	before := Goroutines()
	release, done := make(chan struct{}), make(chan struct{})
	go parked(release, done)
	found := func() bool {
		for _, g := range ownGoroutines() {
			if strings.Contains(g, "testenv.parked") {
				return true
			}
			if strings.Contains(g, "testenv.TestOwnGoroutines(") {
				t.Errorf("the check counts its caller:\n%s", g)
			}
		}
		return false
	}
	WaitUntil(t, 5*time.Second, found)
	if before[goroutineID(stackOf(t, "testenv.parked"))] {
		t.Fatal("Goroutines had the goroutine before it started")
	}
	close(release)
	<-done
	WaitUntil(t, 5*time.Second, func() bool { return !found() })
	WaitGoroutinesEnd(t, before, 5*time.Second)
	if code := CheckGoroutines(3); code != 3 {
		t.Fatalf("CheckGoroutines(3) = %d: a failed run's code must pass through", code)
	}
}

// stackOf is the stack of the goroutine of fenced's code whose stack has frame.
func stackOf(t *testing.T, frame string) string {
	for _, g := range ownGoroutines() {
		if strings.Contains(g, frame) {
			return g
		}
	}
	t.Fatalf("no goroutine in %s", frame)
	return ""
}
