package dedup

// MemoryStoreSize returns how many records the store holds, expired or not.
func MemoryStoreSize(s *MemoryStore) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}
