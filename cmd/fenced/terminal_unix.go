//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package main

import (
	"syscall"
	"unsafe"
)

// terminalForeground reports whether this process's group is the
// foreground group of its controlling terminal: the terminal then sends
// Ctrl-C (SIGINT) and Ctrl-Z to the whole group, the child's children
// included, and the child must stay in it to read the terminal. It asks
// /dev/tty, not stdin: with stdin redirected (< file, a pipe) fenced exec
// is still the terminal's foreground job, and a CMD put in a group of its
// own was stopped for ever reading /dev/tty (a password prompt) and ran on
// after Ctrl-Z stopped fenced exec alone (docs/design.md, defect 179).
func terminalForeground() bool {
	fd, err := syscall.Open("/dev/tty", syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false // no controlling terminal (a daemon, cron, a container)
	}
	defer syscall.Close(fd)
	var pgrp int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pgrp))); errno != 0 {
		return false
	}
	return int(pgrp) == syscall.Getpgrp()
}
