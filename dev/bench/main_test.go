package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-c", "1,x"},
		{"-stores", "mongo"},
		{"-reps", "0"},
		{"-redis-records", "ten"},
		{"-no-such-flag"},
		{"-kafka-batch", "-kafka-records", "0"},
		{"-kafka-batch", "-kafka-partitions", "0"},
		{"-kafka-batch", "-batch", "10"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", args, code, stderr.String())
		}
		if stdout.Len() != 0 {
			t.Errorf("%q: printed %q on stdout", args, stdout.String())
		}
	}
}

func TestMemoryRun(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"-stores", "memory", "-c", "2", "-reps", "1", "-duration", "10ms", "-warmup", "-1ms",
		"-alloc-messages", "-1", "-redis-records", "none", "-q"}
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstderr: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "router+dedup/raw") || stderr.Len() != 0 {
		t.Errorf("stdout %q\nstderr %q", stdout.String(), stderr.String())
	}
}
