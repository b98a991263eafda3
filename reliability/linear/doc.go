// Package linear holds no code: its tests check the histories of every
// store against a sequential model of one record (the Store contract of
// dedup.Store, dedup.BatchStore and dedup/admin's Inspect) with an outside
// linearizability checker, porcupine, as etcd's robustness tests do. Several
// clients issue random operations over a few hot keys while the test
// injects faults (a server SIGKILLed and restarted, a failover, connections
// reset, latency, throttling, dropped responses); each history must be
// linearizable, and the mutant stores (a non-owner's release, a takeover of
// a live lease, a completion lost on restart, a fence used twice) must be
// caught. A history that fails is written with porcupine's visualization to
// $TMPDIR/dedup-histories/ (the failure message names the file).
//
//	go test -race -count=1 -run 'Linear|Porcupine' -v ./reliability/linear/
//
// LINEAR_LONG=1 runs every history about five times longer.
package linear
