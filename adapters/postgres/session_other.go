//go:build !unix

package postgres

import "net"

// pending reports false: without a peek at the socket, a session ended
// before COMMIT is reported as the COMMIT's own error.
func pending(net.Conn) bool { return false }
