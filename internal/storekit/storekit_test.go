package storekit_test

import (
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/storekit"
)

func TestCheckListLimit(t *testing.T) {
	for limit, ok := range map[int]bool{-1: false, 0: false, 1: true, admin.MaxListLimit: true, admin.MaxListLimit + 1: false} {
		if err := storekit.CheckListLimit(limit); (err == nil) != ok {
			t.Errorf("CheckListLimit(%d) = %v", limit, err)
		}
	}
}
