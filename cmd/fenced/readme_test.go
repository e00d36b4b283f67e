package main_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestREADMETour runs the README's five-minute tour as printed: every curl
// and fenced command of its shell blocks, in order, against a fenced dev,
// and compares what they print with the README (lease ids, tokens and TTLs
// masked, since they differ on every run). The examples' commands are run
// by their own tests.
func TestREADMETour(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, tour, ok := strings.Cut(string(b), "## Five-minute tour\n")
	if !ok {
		t.Fatal("README has no five-minute tour")
	}
	tour, _, _ = strings.Cut(tour, "\n## ")
	type step struct{ cmd, want string }
	var steps []step
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(tour, -1) {
		for _, part := range strings.Split("\n"+block[1], "\n$ ")[1:] {
			cmd, want, _ := strings.Cut(part, "\n")
			if strings.HasPrefix(cmd, "curl ") || strings.HasPrefix(cmd, "go run ./cmd/fenced ") {
				steps = append(steps, step{cmd, want})
			}
		}
	}
	if len(steps) < 9 {
		t.Fatalf("%d runnable commands in the tour: %q", len(steps), steps)
	}

	_, url := startDev(t, nil)
	dir := t.TempDir()
	env := childEnv("FENCED_URL=" + url) // where fenced exec finds this fenced dev
	host := strings.TrimPrefix(url, "http://")
	for _, s := range steps {
		cmd := strings.ReplaceAll(s.cmd, "localhost:7070", host)
		cmd = strings.ReplaceAll(cmd, "go run ./cmd/fenced ", bin+" ")
		c := exec.Command("sh", "-c", cmd)
		c.Dir, c.Env = dir, env
		out, _ := c.CombinedOutput() // the README shows what is printed; --try exits 1
		if got, want := maskRun(string(out)), maskRun(s.want); got != want {
			t.Errorf("$ %s\nprinted:\n%s\nthe README shows:\n%s", s.cmd, out, s.want)
		}
	}
}

var (
	leaseIDs = regexp.MustCompile(`\b[0-9a-f]{32}\b`)
	tokens   = regexp.MustCompile(`\b[0-9]{12,19}\b`)
	ttls     = regexp.MustCompile(`"ttl_ms":[0-9]+`)
	waited   = regexp.MustCompile(`waiting [0-9]+ ms|"waited_ms":[0-9]+`)
)

// maskRun replaces what differs between runs: lease ids, tokens, the TTL a
// lease has left, and how long a wait took.
func maskRun(s string) string {
	s = waited.ReplaceAllString(s, "WAITED")
	s = leaseIDs.ReplaceAllString(s, "LEASE_ID")
	s = tokens.ReplaceAllString(s, "TOKEN")
	return strings.TrimSpace(ttls.ReplaceAllString(s, `"ttl_ms":N`))
}
