package storekit_test

import (
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

func TestCheckListLimit(t *testing.T) {
	for limit, ok := range map[int]bool{-1: false, 0: false, 1: true, admin.MaxListLimit: true, admin.MaxListLimit + 1: false} {
		if err := storekit.CheckListLimit(limit); (err == nil) != ok {
			t.Errorf("CheckListLimit(%d) = %v", limit, err)
		}
	}
}

func TestIsNil(t *testing.T) {
	type client interface{ Do() }
	var nilClient client
	var nilPtr *struct{ client }
	for _, tc := range []struct {
		name string
		v    any
		want bool
	}{
		{"nil", nil, true},
		{"nil interface", nilClient, true},
		{"nil pointer in an interface", client(nilPtr), true},
		{"pointer", &struct{ client }{}, false},
		{"value", struct{}{}, false},
	} {
		if got := storekit.IsNil(tc.v); got != tc.want {
			t.Errorf("IsNil(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
