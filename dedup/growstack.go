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
// the way down to the store, each copy walking every frame on the stack:
// 13-18 % of the process's CPU in a profile of the router path on Redis
// (cmd/dedup-bench -cpuprofile), 2 % with this call. The 8 KB it clears
// costs far less than those copies; a stack that is already large is not
// grown. The same trick as CockroachDB's util/growstack.
//
// Measured with paired builds (scripts/paired.sh -m callgrind HEAD <tree
// without it>, 3 pairs, 2026-12-03): without it the router path costs
// 44 % more instructions per message on Redis at c=16 (169 k against
// 117 k) and 37 % more with AutoPipeline at c=64 (190 k against 139 k);
// in time (scripts/paired.sh, 5 pairs at load 6-10), 7 % more CPU per
// message on Redis at c=16 and 34 % more with AutoPipeline at c=16.
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
