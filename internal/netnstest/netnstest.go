// Package netnstest creates network namespaces for tests that need a
// kernel of their own: netfilter, routes and addresses are touched only
// inside them, never in the machine's namespace.
package netnstest

import (
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
)

var count atomic.Int32

// New creates a network namespace named prefix-<pid>-<n>, removed when
// tb ends (also when it fails), and returns its name. It skips tb unless
// the test runs as root and every command in needs (e.g. "nft") is
// installed.
func New(tb testing.TB, prefix string, needs ...string) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root (network namespaces)")
	}
	for _, cmd := range append([]string{"ip"}, needs...) {
		if _, err := exec.LookPath(cmd); err != nil {
			tb.Skip(cmd + " not installed")
		}
	}
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), count.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		tb.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			tb.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return name
}
