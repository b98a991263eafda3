package testserver

import (
	"fmt"
	"os"
	"testing"
)

// Main is a TestMain helper: it calls start (which starts the servers the
// package's tests need, typically into package variables, and returns a
// function that closes them), runs the tests, runs the cleanup and exits
// with the tests' code. If start fails, Main prints the error and exits 1,
// so the package fails with the reason (say, a missing redis-server and how
// to install it) rather than skipping silently.
//
//	var redisAddr string
//
//	func TestMain(m *testing.M) {
//		testserver.Main(m, func() (func(), error) {
//			r, err := testserver.StartRedis()
//			if err != nil {
//				return nil, err
//			}
//			redisAddr = r.Addr
//			return func() { r.Close() }, nil
//		})
//	}
func Main(m *testing.M, start func() (cleanup func(), err error)) {
	cleanup, err := start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		fmt.Println("FAIL: starting test servers")
		os.Exit(1)
	}
	code := m.Run()
	if cleanup != nil {
		cleanup()
	}
	os.Exit(code)
}
