package postgres

// ListSQL returns the statement List runs, for the test that checks its
// plan with and without an index on key.
func ListSQL(s *Store) string { return s.adminSQL(listSQL) }
