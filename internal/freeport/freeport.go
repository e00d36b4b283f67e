// Package freeport hands out loopback ports that were free a moment ago,
// for processes and embedded etcd members that bind them later.
//
// Asking the kernel for a port (listen on 127.0.0.1:0, note the port, close)
// can give the same port twice in a row: the port is free again as soon as
// the listener closes, and Linux picks among its ephemeral ports at random.
// Two ports of one cluster then collide before anything binds them (etcd:
// "initial cluster ... has duplicate url"; seen in CI, in the fault
// comparison's three-member cluster). So this package never hands out the
// same port twice in a process. Another program may still take a port
// before its user binds it; callers retry on "address already in use".
package freeport

import (
	"fmt"
	"net"
	"sync"
)

var (
	mu    sync.Mutex
	given = map[int]bool{} // every port handed out by this process
)

// maxTries bounds how many ports the kernel may offer that were handed out
// already: with tens of thousands of ephemeral ports, a handful of repeats
// in a row means something is wrong.
const maxTries = 100

// Port returns a loopback TCP port that was free a moment ago and that this
// process has not handed out before.
func Port() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	for range maxTries {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find a free loopback port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if err := l.Close(); err != nil {
			return 0, fmt.Errorf("find a free loopback port: %w", err)
		}
		if !given[port] {
			given[port] = true
			return port, nil
		}
	}
	return 0, fmt.Errorf("find a free loopback port: the kernel offered only ports handed out already, %d times", maxTries)
}

// URL returns http://127.0.0.1:port for a port from Port.
func URL() (string, error) {
	p, err := Port()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("http://127.0.0.1:%d", p), nil
}
