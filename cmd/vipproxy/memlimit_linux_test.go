package main

import "testing"

func TestColdStartMemLimit(t *testing.T) {
	total := memTotal()
	if total <= 0 {
		t.Fatalf("memTotal() = %d, want the machine's memory", total)
	}
	got := coldStartMemLimit()
	if got < 1<<30 || (total/4 > 1<<30 && got > total/4) {
		t.Errorf("coldStartMemLimit() = %d, want max(1 GiB, at most a quarter of %d)", got, total)
	}
}
