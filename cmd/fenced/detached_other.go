//go:build !linux

package main

import (
	"syscall"
	"time"
)

// adoptOrphans: only Linux lets a process adopt its orphaned descendants
// (PR_SET_CHILD_SUBREAPER); elsewhere what CMD detached from its process
// group is init's, and outlives it.
func adoptOrphans() bool { return false }

// endDetached has nothing to do where adoptOrphans cannot adopt.
func endDetached(time.Duration, func(int)) {}

// dieWithUs: only Linux signals a child when its parent dies
// (PR_SET_PDEATHSIG); elsewhere CMD outlives a fenced exec that is killed.
func dieWithUs(*syscall.SysProcAttr) {}
