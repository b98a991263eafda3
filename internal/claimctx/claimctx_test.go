package claimctx_test

import (
	"testing"

	"github.com/watermill-dedup/watermill-dedup/internal/claimctx"
)

// One RunInTx at a time per claim, and none once the record is completed;
// one that ended lets the next begin.
func TestBeginTx(t *testing.T) {
	var c claimctx.Claim
	if !c.BeginTx() {
		t.Fatal("the first BeginTx was refused")
	}
	if c.BeginTx() {
		t.Fatal("a BeginTx while one runs was accepted")
	}
	c.EndTx()
	if !c.BeginTx() {
		t.Fatal("a BeginTx after EndTx was refused")
	}
	c.MarkCompleted()
	c.EndTx()
	if !c.Completed() {
		t.Fatal("EndTx cleared Completed")
	}
	if c.BeginTx() {
		t.Fatal("a BeginTx after MarkCompleted was accepted")
	}
}
