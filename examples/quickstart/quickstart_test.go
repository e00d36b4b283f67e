package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// TestQuickstart runs fenced dev, then this program with the arguments of
// the "sdk:" line fenced dev prints, as the README tells a newcomer to:
// with leases in etcd, in Redis, and through the fenced server.
func TestQuickstart(t *testing.T) {
	bin := buildFenced(t)
	for _, mode := range []struct {
		name string
		dev  []string
	}{
		{"etcd", nil},
		{"redis", []string{"--redis-addr", testenv.RedisAddr()}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			url, lines := startDev(t, bin, mode.dev...)
			var sdk string
			for _, l := range lines {
				if s, ok := strings.CutPrefix(l, "sdk: go run ./examples/quickstart "); ok {
					sdk = s
				}
			}
			if sdk == "" {
				t.Fatalf("fenced dev printed no sdk: line:\n%s", strings.Join(lines, "\n"))
			}
			checkRun(t, strings.Fields(sdk))
			checkRun(t, []string{"--url", url})
		})
	}
}

var outputLines = []*regexp.Regexp{
	regexp.MustCompile(`^holder 1 has "invoice-7" with token (\d+); its write is admitted$`),
	regexp.MustCompile(`^holder 2 has "invoice-7" with token (\d+); its write is admitted$`),
	regexp.MustCompile(`^holder 1 writes late with token (\d+): rejected: fence: stale token \d+ for "invoice-7": highest admitted is \d+$`),
}

func checkRun(t *testing.T, args []string) {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := run(t.Context(), args, &out, &errOut); err != nil {
		t.Fatalf("quickstart %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(outputLines) {
		t.Fatalf("quickstart %s printed:\n%s", strings.Join(args, " "), out.String())
	}
	var tokens []uint64
	for i, re := range outputLines {
		m := re.FindStringSubmatch(lines[i])
		if m == nil {
			t.Fatalf("quickstart %s: line %q does not match %s", strings.Join(args, " "), lines[i], re)
		}
		n, err := strconv.ParseUint(m[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, n)
	}
	if tokens[1] <= tokens[0] || tokens[2] != tokens[0] {
		t.Fatalf("tokens %v: want the second above the first, and the first writing late", tokens)
	}
}

// TestREADMEShowsThisProgram: the README's SDK code is this program's, as
// it is, so that it cannot drift from code a test runs.
func TestREADMEShowsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "**5. Use the SDK.**")
	if !ok {
		t.Fatal("README has no **5. Use the SDK.** step")
	}
	_, block, ok := strings.Cut(after, "```go\n")
	if ok {
		block, _, ok = strings.Cut(block, "```\n")
	}
	if !ok || strings.Count(block, "\n") < 20 {
		t.Fatalf("no Go block of the quickstart in the README's step 5")
	}
	if !strings.Contains(string(src), block) {
		t.Fatalf("the README's SDK code is not a part of examples/quickstart/main.go as it is:\n%s", block)
	}
}

// buildFenced builds cmd/fenced into the test's temporary directory.
func buildFenced(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fenced")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(t.Context(), "go", append(args, "../../cmd/fenced")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build fenced: %v\n%s", err, out)
	}
	return bin
}

// startDev runs fenced dev on a free port until the test ends, and returns
// its URL and the lines it printed after the first.
func startDev(t *testing.T, bin string, args ...string) (string, []string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"dev", "--listen", "127.0.0.1:0"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FENCED_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 16)
	go func() { // ends at EOF, when fenced exits
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("fenced dev stderr:\n%s", stderr.String())
		}
	})
	var got []string
	timeout := time.After(60 * time.Second)
	for len(got) == 0 || !strings.HasPrefix(got[len(got)-1], "sdk:") {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("fenced dev exited after printing %q", got)
			}
			got = append(got, l)
		case <-timeout:
			t.Fatalf("fenced dev printed %q in 60s", got)
		}
	}
	url, ok := strings.CutPrefix(got[0], "fenced listening on ")
	if !ok {
		t.Fatalf("first line %q", got[0])
	}
	return url, got[1:]
}
