package testserver

import (
	"errors"
	"runtime"
)

func lockAndExit() { runtime.LockOSThread() }

func isAddrInUse(err error) bool { return errors.Is(err, errAddrInUse) }
