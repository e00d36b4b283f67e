//go:build unix

package postgres

import (
	"errors"
	"net"
	"syscall"
)

// pending reports whether c has bytes to read, or has been closed by the
// server, without reading or waiting. Go's sockets are non-blocking, so
// the peek returns at once. Bytes that pgconn's background reader took
// already are not seen: the COMMIT's outcome is then reported unknown.
func pending(c net.Conn) bool {
	sc, ok := c.(syscall.Conn) // *net.TCPConn and *net.UnixConn; not TLS
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var b [1]byte
	var perr error
	// Control, not Read: pgconn's background reader may sit in a Read of
	// this socket, holding its read lock, until the server sends again.
	err = rc.Control(func(fd uintptr) {
		_, _, perr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
	})
	if err != nil {
		return false
	}
	// No error is a byte, or 0 bytes for the end of the stream; an error
	// other than "nothing yet" is a broken connection, which pgconn reports.
	return !errors.Is(perr, syscall.EAGAIN) && !errors.Is(perr, syscall.EWOULDBLOCK) && !errors.Is(perr, syscall.EINTR)
}
