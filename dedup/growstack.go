package dedup

// stackReserve is the stack growStack makes room for: with what the router
// and the middleware have already used, the goroutine gets a 16 KB stack,
// which holds a message's whole path (the middleware, the engine, the
// store and go-redis, a few KB deep) without growing again.
const stackReserve = 8 << 10

// growStack grows the calling goroutine's stack in one step, while the
// stack is still shallow. Watermill's router runs each message on a new
// goroutine, whose stack starts small (2 KB, or the runtime's running
// average) and would otherwise be doubled and copied two or three times on
// the way down to the store, each copy walking every frame on the stack.
// The 8 KB it clears costs far less than those copies; a stack that is
// already large is not grown. The same trick as CockroachDB's
// util/growstack. Paired builds with and without it (scripts/paired.sh, in
// time and with -m callgrind) show what it saves on the router path; see
// docs/dev/decisions.md.
//
//go:noinline
func growStack() {
	var buf [stackReserve]byte
	keep(buf[:])
}

// keep makes growStack's buffer a real stack object the compiler cannot
// drop.
//
//go:noinline
func keep([]byte) {}
