package lock_test

import (
	"strings"
	"testing"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// TestRedisPrefixWithABraceIsRefused: a prefix with "{" or "}" would come
// before the lock's {name} and change its keys' hash tag; on a Redis
// Cluster "{}" made every script fail with CROSSSLOT and "{app}" put every
// lock on one master. The store refuses it, saying why and what to give
// (docs/design.md, defect 200).
func TestRedisPrefixWithABraceIsRefused(t *testing.T) {
	rdb := testenv.Redis(t)
	for _, p := range []string{"{}", "app{}:", "{app}:", "app}:", ""} {
		s, err := lock.NewRedisStore(rdb, newSequencer(t), lock.WithRedisPrefix(p))
		if err == nil {
			s.Close()
			t.Errorf("prefix %q taken", p)
			continue
		}
		if !strings.Contains(err.Error(), "such as fenced:") {
			t.Errorf("prefix %q: %v, want what to give", p, err)
		}
	}
	for _, p := range []string{"fenced:", "app-a:", "a/b:"} {
		if err := lock.ValidateRedisPrefix(p); err != nil {
			t.Errorf("prefix %q: %v", p, err)
		}
	}
}
