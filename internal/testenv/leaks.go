package testenv

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// ownPackages marks a goroutine as fenced's: a frame of the module's code
// other than the test harness that looks for them.
const ownPackages = "github.com/fenced/fenced/"

// CheckGoroutines is a test binary's exit code: code, m.Run's result, or 1
// if a goroutine of fenced's own code outlives the tests. Every goroutine
// must have an owner that stops it (a Close, a context, a Cleanup), and one
// still running once every test and its cleanups are done had none. A
// package's TestMain passes it to os.Exit. Goroutines get a while to end,
// since a stopped one may still be on its way out.
func CheckGoroutines(code int) int {
	if code != 0 {
		return code
	}
	left := outliving(func() []string { return newSince(nil) }, 10*time.Second)
	if len(left) == 0 {
		return 0
	}
	fmt.Fprintf(os.Stderr, "FAIL: %d goroutine(s) of fenced's code outlived the tests (each needs an owner that stops it):\n\n%s\n",
		len(left), strings.Join(left, "\n\n"))
	return 1
}

// ownGoroutines is the stack of every goroutine running fenced's code,
// other than this check's.
func ownGoroutines() []string {
	var own []string
	for _, s := range GoroutinesIn(ownPackages) {
		if !strings.Contains(s, "testenv.ownGoroutines") {
			own = append(own, s)
		}
	}
	return own
}

// GoroutinesIn is the stack of every goroutine whose stack contains code,
// such as "fenced/lock.(*RedisStore)": the goroutines of one component.
func GoroutinesIn(code string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var in []string
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if s := string(g); strings.Contains(s, code) {
			in = append(in, s)
		}
	}
	return in
}

// Goroutines is the set of goroutines running fenced's code now, by their
// first line ("goroutine 7 [...]" without the state), for
// WaitGoroutinesEnd.
func Goroutines() map[string]bool {
	set := make(map[string]bool)
	for _, g := range ownGoroutines() {
		set[goroutineID(g)] = true
	}
	return set
}

// WaitGoroutinesEnd fails the test unless every goroutine of fenced's code
// that is not in before ends within the given time: what a component the
// test started and stopped must leave behind is nothing.
func WaitGoroutinesEnd(t testing.TB, before map[string]bool, within time.Duration) {
	t.Helper()
	left := outliving(func() []string { return newSince(before) }, within)
	if len(left) == 0 {
		return
	}
	t.Fatalf("%d goroutine(s) of fenced's code still running %s after it stopped:\n\n%s", len(left), within, strings.Join(left, "\n\n"))
}

// WaitGoroutinesInEnd fails the test unless every goroutine whose stack
// contains code (GoroutinesIn) ends within the given time: what a stopped
// component leaves behind is nothing.
func WaitGoroutinesInEnd(t testing.TB, code string, within time.Duration) {
	t.Helper()
	left := outliving(func() []string { return GoroutinesIn(code) }, within)
	if len(left) == 0 {
		return
	}
	t.Fatalf("%d goroutine(s) in %s still running %s after it stopped:\n\n%s", len(left), code, within, strings.Join(left, "\n\n"))
}

// newSince is the stacks of the goroutines of fenced's code not in before.
func newSince(before map[string]bool) []string {
	var left []string
	for _, g := range ownGoroutines() {
		if !before[goroutineID(g)] {
			left = append(left, g)
		}
	}
	return left
}

// outliving waits until running lists none, or within has passed, and
// returns the stacks it listed last. Polling: nothing tells when a
// goroutine ends.
func outliving(running func() []string, within time.Duration) []string {
	deadline := time.Now().Add(within)
	for {
		left := running()
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// goroutineID is "goroutine N" of a goroutine's stack.
func goroutineID(stack string) string {
	id, _, _ := strings.Cut(stack, " [")
	return id
}
