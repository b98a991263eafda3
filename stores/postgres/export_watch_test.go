package postgres

// ChannelOf is the notification channel of a scoped key.
func ChannelOf(key string) string { return channelOf(key) }

// OpenWatches returns how many key watches the store has open.
func OpenWatches(s *Store) int {
	if s.watch == nil {
		return 0
	}
	return s.watch.Watches()
}
