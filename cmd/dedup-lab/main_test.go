package main

import "testing"

func TestLabCommandDefaults(t *testing.T) {
	if code := run([]string{"-orders", "50", "-effect-time", "1ms"}); code != 0 {
		t.Fatalf("dedup-lab exited %d", code)
	}
}

func TestLabCommandRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-idempotency", "maybe"},
		{"-copies", "0"},
		{"-broker", "carrier-pigeon"},
		{"-store", "floppy"},
		{"-no-such-flag"},
	} {
		if code := run(args); code != 2 {
			t.Errorf("dedup-lab %v exited %d, want 2", args, code)
		}
	}
}
