// Package testserver starts the servers that the test suite needs (Redis,
// a Redis Cluster, dynalite, fauxqs and PostgreSQL, and moto_server where it
// is installed) as child processes on free 127.0.0.1 ports, and stops them
// again.
//
// Every Start function returns a handle whose Close method stops the
// server and removes its temporary directory; call it from t.Cleanup or
// from TestMain (see Main). Servers that other people run, such as a
// redis-server already listening on 127.0.0.1:6379, are never used or
// touched, with one documented exception: StartPostgres reuses a
// PostgreSQL server that accepts trust logins on 127.0.0.1:5432 (tests
// must then create and drop their own databases or schemas, never wipe
// existing ones).
//
// Child processes do not outlive the test binary:
//
//   - each runs in its own process group, and Close kills the whole group
//     and waits for it;
//   - each is started with SysProcAttr.Pdeathsig = SIGKILL. Linux sends that
//     signal when the OS thread that forked the child exits, not when the
//     process exits, so all children are forked from one dedicated
//     goroutine that is locked to its OS thread and never unlocks it: that
//     thread lives exactly as long as the test binary, so the children are
//     killed when the binary dies (panic, timeout, os.Exit, SIGKILL), and
//     never earlier.
//
// Missing programs produce errors that say how to install them: the
// repository's `make test` installs everything through
// scripts/ensure-test-deps.sh (Debian packages redis-server and postgresql,
// and the npm packages of tools/ through `npm ci --prefix tools`). The one
// optional server is moto_server (Python moto, a second DynamoDB
// implementation): StartMoto returns ErrMotoMissing where it is not
// installed, and the tests that use it skip with that error's advice.
//
// The package uses only the standard library; it speaks just enough RESP
// and PostgreSQL wire protocol to tell when a server is ready.
package testserver
