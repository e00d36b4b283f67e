package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// prSetChildSubreaper is prctl's PR_SET_CHILD_SUBREAPER (linux/prctl.h).
const prSetChildSubreaper = 36

// dieWithUs has the kernel send CMD SIGTERM if this process dies first
// (SIGKILL, the OOM killer): nobody would refresh its lease then. Linux
// sends it when the thread that started CMD exits, so the caller keeps that
// thread, locked, until CMD has exited (golang/go#27505).
func dieWithUs(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGTERM }

// adoptOrphans makes this process the reaper of its descendants: one that
// CMD started and detached from its process group (setsid, a daemon's
// double fork) becomes this process's child when its parent exits, rather
// than init's, so that endDetached can find and stop it. It reports
// whether that holds (as PID 1 it does anyway).
func adoptOrphans() bool {
	if os.Getpid() == 1 {
		return true
	}
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	return errno == 0
}

// endDetached stops what CMD left running outside its process group, once
// CMD has exited and its group has been ended: every child this process
// still has came from CMD (adoptOrphans), and the work the lease covers
// must not outlive it. Each, and the process group it leads or belongs to
// (not this process's), gets SIGTERM, then SIGKILL after grace; a process
// adopted meanwhile (a child of one that was stopped) gets the same. saying
// is called first with how many were found, if any. Children are looked
// for every 10ms, and reaped.
func endDetached(grace time.Duration, saying func(n int)) {
	left := detachedChildren()
	if len(left) == 0 {
		return
	}
	saying(len(left))
	own := syscall.Getpgrp()
	sig, signalled := syscall.SIGTERM, make(map[int]bool)
	killAt := time.Now().Add(grace)
	giveUp := killAt.Add(time.Second) // past SIGKILL only what cannot die (uninterruptible sleep) is left
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for len(left) > 0 && time.Now().Before(giveUp) {
		for pid, pgrp := range left {
			if signalled[pid] {
				continue
			}
			signalled[pid] = true
			_ = syscall.Kill(pid, sig)
			if pgrp > 1 && pgrp != own {
				_ = syscall.Kill(-pgrp, sig) // its group: what it started and did not wait for
			}
		}
		<-tick.C
		if sig == syscall.SIGTERM && !time.Now().Before(killAt) {
			sig, signalled = syscall.SIGKILL, make(map[int]bool)
		}
		left = detachedChildren()
	}
}

// detachedChildren reaps this process's exited children and returns the
// others, each with its process group.
func detachedChildren() map[int]int {
	reap(-1)
	self := os.Getpid()
	// /proc must be this PID namespace's: one made without mounting its own
	// (unshare --pid, a bare clone) still shows the parent namespace's,
	// whose pids name other processes here, and whose ppid 1 is another
	// init's children.
	if b, err := os.ReadFile("/proc/self/stat"); err != nil || !strings.HasPrefix(string(b), strconv.Itoa(self)+" ") {
		return nil
	}
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	kids := make(map[int]int)
	for _, e := range dir {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 3 || f[0] == "Z" {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == self {
			kids[pid], _ = strconv.Atoi(f[2])
		}
	}
	return kids
}
