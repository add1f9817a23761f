//go:build unix

package cpustat

import (
	"testing"
	"time"
)

func TestProcessGrows(t *testing.T) {
	before := Process()
	deadline := time.Now().Add(50 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	if after := Process(); after <= before || before < 0 {
		t.Errorf("Process() %v then %v after 50 ms of work (x=%d), want it to grow", before, after, x)
	}
}
