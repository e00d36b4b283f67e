package main

import "syscall"

// setPdeathsig has the kernel kill the worker when the orchestrator's
// thread that started it dies, so that a killed orchestrator leaves no
// worker behind, not even a frozen one. A worker also exits when its stdin
// closes, which covers the other systems unless the worker is frozen.
func setPdeathsig(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
