package memory

// Size returns how many records the store holds, expired or not.
func Size(s *Store) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}
