// Package testsupport is the root of what the library modules' own tests
// need, and the repository's tooling (dev/) with them: test servers started
// on free loopback ports (testserver), a process crashed at a chosen
// instant (crashtest), a store that fails on demand (faultstore), a memory
// store in one expression (memstore), PostgreSQL schemas per test
// (pgtest), the wake-up benchmark of waiting copies (waitbench) and slog's
// default logger captured (slogcapture). Its packages import only the
// standard library and this module, and only _test.go files and dev/
// import them: nothing here reaches a user's build.
package testsupport
