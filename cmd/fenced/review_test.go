package main_test

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// hungServer is the URL of a server that takes connections and requests
// and never answers (a wedged process, a partition after the connect).
func hungServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	done := make(chan struct{})
	go func() { // ends when the listener closes
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

// TestCommandsGiveUpOnAServerThatDoesNotAnswer: fenced exec's first
// attempt and fenced locks asked the server for no wait, and the client
// bounds such a request by its context alone, which only a signal ended:
// against a server that took the request and never answered, fenced exec
// --wait 1s and fenced locks get ran until killed. Now --timeout bounds
// them (and --wait, fenced exec's first attempt).
func TestCommandsGiveUpOnAServerThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	url := hungServer(t)
	name := testenv.Name(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "--url", url, "--wait", "1s", name, "--", "true"}, "no answer from " + url},
		{[]string{"exec", "--url", url, "--try", "--timeout", "1s", name, "--", "true"}, "no answer from " + url},
		{[]string{"locks", "get", "--url", url, "--timeout", "1s", name}, "no answer from " + url + " within --timeout 1s"},
		{[]string{"locks", "release", "--url", url, "--timeout", "1s", name}, "may have been released"},
	} {
		p := start(t, nil, c.args...)
		code := p.wait(20 * time.Second)
		if stderr := p.stderr.String(); code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("fenced %s: exit %d, stderr:\n%s\nwant exit 1 and %q", strings.Join(c.args, " "), code, stderr, c.want)
		}
	}
}
