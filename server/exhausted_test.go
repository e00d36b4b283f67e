package server

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
)

// TestTokensExhausted: with no token left below 2^63 above the floor
// (sequencer.ErrTokensExhausted), an acquisition's 503 and the log say
// that, and what to do, rather than "check that Redis and etcd are
// reachable", which they are; and /readyz says the same instead of ready,
// since this node grants no lock until an operator acts. The floor is
// written by hand: RaiseFloor no longer sets one that high.
func TestTokensExhausted(t *testing.T) {
	_, cli := testenv.Etcd(t)
	for _, store := range []string{"redis", "etcd"} {
		t.Run(store, func(t *testing.T) {
			prefix := "/" + testenv.Name(t) + "/"
			if _, err := cli.Put(t.Context(), prefix+"floor", strconv.FormatUint(uint64(fence.MaxToken)-1, 10)); err != nil {
				t.Fatal(err)
			}
			var ls lock.LeaseStore
			if store == "redis" {
				seq, err := sequencer.NewEtcd(cli, sequencer.WithPrefix(prefix))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { seq.Close() })
				rs, err := lock.NewRedisStore(testenv.Redis(t), seq, lock.WithRedisPrefix(testenv.Name(t)+":"))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { rs.Close() })
				ls = rs
			} else {
				es, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix(prefix))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { es.Close() })
				ls = es
			}
			var logs testenv.SyncBuffer
			env := newEnv(t, ls, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
			msg := env.do("POST", "/v1/locks/"+testenv.Name(t)+"/acquire", `{"ttl_ms":30000}`).errCode(t, http.StatusServiceUnavailable, codeUnavailable)
			wantSaid(t, "acquire with no token left", msg, &logs, "below 2^63", "used up", "--etcd-prefix", "restart every fenced")
			if strings.Contains(msg, "reachable") {
				t.Errorf("acquire with no token left: %q; it says to check that the backends are reachable, which they are", msg)
			}
			msg = env.do("GET", "/readyz", "").errCode(t, http.StatusServiceUnavailable, codeUnavailable)
			wantSaid(t, "readyz with no token left", msg, &logs, "below 2^63", "used up", "--etcd-prefix")
		})
	}
}
