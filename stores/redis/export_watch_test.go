package redis

import (
	"strings"
	"time"
)

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

// SetAnnounce makes the completing and releasing scripts announce the
// change (true, as shipped) or not, for the benchmark that measures what
// the announcement costs. Call it only while no script runs.
func SetAnnounce(on bool) {
	for _, op := range []struct {
		script *ownedScript
		src    string
	}{{completeOp, completeSrc}, {releaseOp, releaseSrc}} {
		src := op.src
		if !on {
			src = strings.Replace(src, announce, "", 1)
		}
		*op.script = *newOwnedScript(src)
	}
}
