package kafkabroker_test

import (
	"slices"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dev/harness/kafkabroker"
)

func TestParseBrokers(t *testing.T) {
	if got := kafkabroker.ParseBrokers(" a:9092, b:9092 ,,"); !slices.Equal(got, []string{"a:9092", "b:9092"}) {
		t.Errorf("ParseBrokers = %q", got)
	}
	if got := kafkabroker.ParseBrokers(" , "); got != nil {
		t.Errorf("ParseBrokers of blanks = %q, want nil", got)
	}
}
