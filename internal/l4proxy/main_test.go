package l4proxy

import (
	"fmt"
	"net"
	"os"
	"testing"
)

// TestMain skips the package where 127.0.0.2 is not a local address (macOS
// has only 127.0.0.1 unless lo0 aliases are added): the tests use several
// loopback addresses to tell backends and clients apart.
func TestMain(m *testing.M) {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		fmt.Println("skipping: 127.0.0.2 is not local here:", err)
		os.Exit(0)
	}
	ln.Close()
	os.Exit(m.Run())
}
