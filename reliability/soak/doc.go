// Package soak holds no code: its tests run a Watermill router with the
// dedup middleware on Redis (AOF) and on PostgreSQL through a long run of
// messages on Redis Streams, a quarter of them copies of earlier keys,
// with consumer processes SIGKILLed and restarted every few seconds beside
// one that lives throughout; every effect is a row of a PostgreSQL table.
// Each test checks that no key is lost, that every doubled effect is one
// of the documented crash window (an effect whose consumer was killed
// before its record was completed), and that the long-lived consumer's
// memory and goroutines stay flat.
//
//	go test -race -count=1 -run Soak -v ./reliability/soak/         # 20,000 messages each
//	make soak                                                       # a million each
package soak
