//go:build !unix

package main

import (
	"errors"
	"os"
	"syscall"
)

var errNoSIGSTOP = errors.New("this example freezes a worker with SIGSTOP and needs a Unix system")

func freeze(*os.Process) error          { return errNoSIGSTOP }
func thaw(*os.Process) error            { return errNoSIGSTOP }
func sysProcAttr() *syscall.SysProcAttr { return nil }
