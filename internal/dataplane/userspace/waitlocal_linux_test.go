//go:build linux

package userspace

import (
	"net/netip"
	"os"
	"testing"
	"time"
)

// TestWaitLocalChild checks, inside TestNetns's namespace, that waitLocal
// returns at once for a local address (its lookup sees RTN_LOCAL) and
// gives up after its bound for an address that is not local.
func TestWaitLocalChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("run by TestNetns inside its namespace")
	}
	start := time.Now()
	waitLocal(netip.MustParseAddr("::1"))
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Errorf("waitLocal(::1) took %v; the local route was not recognised", d)
	}
	start = time.Now()
	waitLocal(netip.MustParseAddr("fd00:dead::1"))
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Errorf("waitLocal(fd00:dead::1) returned after %v for a non-local address", d)
	}
}
