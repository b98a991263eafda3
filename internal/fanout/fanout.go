// Package fanout runs one function per index, a bounded number at once.
package fanout

import "sync"

// Each calls fn(i) for every i in [0, n), at most limit at once (limit < 1
// means one at a time), and returns when every call has returned. fn must
// not panic (a store's request does not).
//
// It is what the engine uses for a store without the batch capability,
// and what dedup/storekit.Each gives stores.
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

// EachInKeyOrder is Each for requests on keys (keys[i] is request i's):
// requests on distinct keys run concurrently, at most limit at once, and
// a request on a key that an earlier request also names starts only
// after that one returned, so that the requests of one key run in their
// order. It runs in waves: the first request of every key, then the
// second of every key named twice, and so on.
func EachInKeyOrder(keys []string, limit int, fn func(i int)) {
	seen := make(map[string]int, len(keys))
	var waves [][]int
	for i, k := range keys {
		w := seen[k]
		seen[k] = w + 1
		if w == len(waves) {
			waves = append(waves, nil)
		}
		waves[w] = append(waves[w], i)
	}
	for _, wave := range waves {
		Each(len(wave), limit, func(j int) { fn(wave[j]) })
	}
}
