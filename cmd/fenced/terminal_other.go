//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd)

package main

// terminalForeground: without the terminal ioctls CMD always leads a
// process group of its own.
func terminalForeground() bool { return false }
