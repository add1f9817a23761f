//go:build linux

package k8s

import (
	"fmt"
	"os"
	"testing"

	"github.com/vipproxy/vipproxy/test/e2e"
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vpk8s-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8s:", err)
		os.Exit(1)
	}
	e2e.SetBuildDir(dir)
	if os.Geteuid() == 0 {
		SweepStale()
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
