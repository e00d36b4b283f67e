package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/freeport"
)

// A --wait rides out a server that is away at the first attempt, as it
// rides out one that goes away during the wait. Before, the first
// attempt's refused connection ended fenced exec at once, with nearly all
// of its wait left (docs/design.md, defect 144).
func TestExecWaitRidesOutAServerAwayAtFirst(t *testing.T) {
	t.Parallel()
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	dir := t.TempDir()
	p := start(t, nil, "exec", "--url", "http://"+addr, "--wait", "45s", "away", "--", "sh", "-c", `touch "$0/ran"`, dir)
	eventually(t, 30*time.Second, "the first attempt refused, and fenced exec trying again", func() bool {
		return strings.Contains(p.stderr.String(), "trying again up to --wait 45s")
	})
	startDev(t, nil, "--listen", addr)
	if code := p.wait(60 * time.Second); code != 0 {
		t.Fatalf("fenced exec: exit %d, stderr:\n%s", code, p.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err != nil {
		t.Fatalf("CMD did not run: %v", err)
	}
}
