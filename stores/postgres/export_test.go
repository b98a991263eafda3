package postgres

// Fallbacks returns how many claims needed the second, locking statement.
func Fallbacks(s *Store) int64 { return s.fallbacks.Load() }

// ClaimLockedSQL returns the locking claim statement, which the benchmarks
// also measure on its own.
func ClaimLockedSQL(s *Store) string { return s.sql.claimLocked }
