// Package reliability holds no code: its tests are the end-to-end
// reliability scenarios of watermill-dedup (concurrency, a chaos run with
// Redis restarts, a crashed consumer, long handlers, lost claims, network
// faults, bad input and key isolation), run against real servers, each
// printing the figures it measured. README.md shows those figures and the
// command that reproduces them:
//
//	go test -race -v ./reliability/
package reliability
