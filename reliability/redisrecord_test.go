package reliability_test

// redisRecordState reads the state of a Redis record value as the store
// writes it (stores/redis record.go): 'C' for a compact completed record
// (decimal digits), else the state byte of formats 1 and 2 ('P' or 'C');
// 0 for anything else.
func redisRecordState[T string | []byte](v T) byte {
	switch {
	case len(v) > 0 && v[0] >= '0' && v[0] <= '9':
		return 'C'
	case len(v) > 1 && (v[0] == 1 || v[0] == 2):
		return v[1]
	}
	return 0
}
