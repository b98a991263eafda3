package postgres

import (
	"math"
	"testing"
	"time"
)

func TestMicrosRoundsUpWithoutOverflow(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{time.Nanosecond, 1},
		{time.Microsecond, 1},
		{time.Microsecond + 1, 2},
		{time.Second, 1_000_000},
		{math.MaxInt64, math.MaxInt64 / 1000},
	} {
		if got := micros(tc.d); got != tc.want {
			t.Errorf("micros(%d) = %d, want %d", tc.d, got, tc.want)
		}
	}
}
