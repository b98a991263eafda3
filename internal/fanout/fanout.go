// Package fanout runs one function per index, a bounded number at once.
package fanout

import "sync"

// Each calls fn(i) for every i in [0, n), at most limit at once (limit < 1
// means one at a time), and returns when every call has returned. fn must
// not panic (a store's request does not).
//
// It is what a store's batch methods use to send one request per record
// concurrently (DynamoDB), and what the engine uses for a store without
// the batch capability.
func Each(n, limit int, fn func(i int)) {
	if n <= 1 || limit <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			fn(i)
		}()
	}
	wg.Wait()
}
