package redis

import "time"

// SetWatchLinger replaces the store's key watches, before any is used,
// with ones whose connection closes after d without a watch.
func SetWatchLinger(s *Store, d time.Duration) { s.watch = newWatchHub(s.client, d) }

// OpenWatches returns how many key watches the store has open.
func OpenWatches(s *Store) int {
	if s.watch == nil {
		return 0
	}
	return s.watch.Watches()
}
