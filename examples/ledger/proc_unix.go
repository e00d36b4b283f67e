//go:build unix

package main

import (
	"os"
	"syscall"
)

// freeze stops the process with SIGSTOP: every thread of it, its lease
// keep-alive and timers included, as a long GC pause or a swapped-out
// process would be.
func freeze(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }

// thaw resumes a frozen process with SIGCONT.
func thaw(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

// sysProcAttr puts a worker in a process group of its own, so that a ^C at
// the terminal reaches only the orchestrator, which kills its workers; on
// Linux a worker is also killed when the orchestrator dies.
func sysProcAttr() *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	setPdeathsig(a)
	return a
}
