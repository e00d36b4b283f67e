package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// TestRunLeavesNoGoroutine runs fenced dev and fenced serve in this
// process, holds a lock and queues a waiter on it, then ends Run as a
// signal does: once Run has returned, no goroutine of fenced's code may
// be left. A daemon that exits right after would hide one; an embedding
// of the same parts (server, stores, sequencer) would not.
func TestRunLeavesNoGoroutine(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
	}{
		{"dev", []string{"dev", "--listen", "127.0.0.1:0"}},
		{"serve", []string{"serve", "--listen", "127.0.0.1:0", "--redis-addr", testenv.RedisAddr(),
			"--redis-prefix", testenv.Name(t) + ":", "--etcd-data-dir", t.TempDir()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, kv := range []string{"FENCED_LISTEN", "FENCED_REDIS_ADDR", "FENCED_LEASE_STORE", "FENCED_AUTH_TOKEN_FILE", "FENCED_ETCD_ENDPOINTS"} {
				t.Setenv(kv, "") // restored after the test
				os.Unsetenv(kv)  // the command line alone
			}
			before := testenv.Goroutines()
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			out, w := io.Pipe()
			var stderr testenv.SyncBuffer
			ran := make(chan error, 1)
			go func() { // ends when Run does, which stop makes it
				err := Run(ctx, c.args, w, &stderr)
				w.Close()
				ran <- err
			}()
			lines := bufio.NewScanner(out)
			if !lines.Scan() {
				t.Fatalf("no first line: Run: %v; stderr:\n%s", <-ran, stderr.String())
			}
			base, ok := strings.CutPrefix(lines.Text(), "fenced listening on ")
			if !ok {
				t.Fatalf("first line %q; stderr:\n%s", lines.Text(), stderr.String())
			}
			go func() { // drains the rest of stdout; ends when Run closes it
				for lines.Scan() {
				}
			}()
			name := testenv.Name(t)
			post := func(body string) (int, map[string]any) {
				resp, err := http.Post(base+"/v1/locks/"+name+"/acquire", "application/json", strings.NewReader(body))
				if err != nil {
					return 0, map[string]any{"error": err.Error()}
				}
				defer resp.Body.Close()
				var doc map[string]any
				_ = json.NewDecoder(resp.Body).Decode(&doc)
				return resp.StatusCode, doc
			}
			if code, doc := post(`{"ttl_ms":30000}`); code != http.StatusOK {
				t.Fatalf("acquire: %d %v", code, doc)
			}
			waited := make(chan int, 1)
			go func() { // ends with the request: the shutdown answers it
				code, _ := post(`{"ttl_ms":30000,"wait_ms":30000}`)
				waited <- code
			}()
			testenv.WaitUntil(t, 10*time.Second, func() bool {
				resp, err := http.Get(base + "/v1/locks/" + name)
				if err != nil {
					return false
				}
				defer resp.Body.Close()
				var st struct{ Waiters int }
				return json.NewDecoder(resp.Body).Decode(&st) == nil && st.Waiters == 1
			})
			stop()
			if err := <-ran; err != nil {
				t.Fatalf("Run: %v; stderr:\n%s", err, stderr.String())
			}
			if code := <-waited; code != http.StatusServiceUnavailable {
				t.Errorf("the waiting acquire got %d at shutdown, want 503", code)
			}
			http.DefaultClient.CloseIdleConnections()
			testenv.WaitGoroutinesEnd(t, before, 10*time.Second)
		})
	}
}
