package nfcount

import (
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vipproxy/vipproxy/internal/netnstest"
)

// nft runs nft -f with script in namespace ns.
func nft(t *testing.T, ns, script string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %.600s", err, out)
	}
}

// bigTable writes table ip t: chains a (3 rules), b (1) and c (none), a map m of n
// elements (many dump batches), a set s of 2 and an interval set r.
func bigTable(t *testing.T, ns string, n int) {
	t.Helper()
	var b strings.Builder
	b.WriteString("table ip t {\n map m { type ipv4_addr . inet_service : ipv4_addr . inet_service; }\n set s { type ipv4_addr; elements = { 10.0.0.1, 10.0.0.2 } }\n")
	b.WriteString(" set r { type ipv4_addr; flags interval; elements = { 10.1.0.0/16 } }\n")
	b.WriteString(" chain a { ip daddr 10.0.0.1 accept; ip daddr @s accept; counter; }\n chain b { counter; }\n chain c { }\n}\n")
	for lo := 0; lo < n; lo += 10000 {
		b.WriteString("add element ip t m {")
		for i := lo; i < min(n, lo+10000); i++ {
			if i > lo {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, " 10.%d.%d.%d . 80 : 10.200.0.1 . 8080", 96+i>>16, i>>8&255, i&255)
		}
		b.WriteString(" }\n")
	}
	nft(t, ns, b.String())
}

// TestCount: Table, Chains and Elements over a real kernel, through dumps
// many receives long, and over what is missing.
func TestCount(t *testing.T) {
	ns := netnstest.New(t, "vpnfcount", "nft")
	const n = 70_000 // about 3 MB of dump: a hundred receives
	bigTable(t, ns, n)
	o := Options{Netns: ns, Elements: true}

	c, err := Table(IPv4, "t", o)
	if err != nil {
		t.Fatal(err)
	}
	if c.Rules["a"] != 3 || c.Rules["b"] != 1 || len(c.Rules) != 2 {
		t.Errorf("rules %v, want a:3 b:1", c.Rules)
	}
	if c.Elems["m"] != n || c.Elems["s"] != 2 {
		t.Errorf("elements %v, want m:%d s:2", c.Elems, n)
	}
	if _, ok := c.Elems["r"]; ok || !c.Sets["r"] || !c.Sets["m"] || !c.Sets["s"] || len(c.Sets) != 3 {
		t.Errorf("sets %v, elements %v: want m, s and the interval set r, r not counted", c.Sets, c.Elems)
	}
	o.ElementsOf = func(set string) bool { return set == "s" }
	if c, err := Table(IPv4, "t", o); err != nil || len(c.Elems) != 1 || c.Elems["s"] != 2 {
		t.Errorf("Table counting s only = %v, %v", c.Elems, err)
	}

	got, err := Chains(IPv4, "t", []string{"a", "b", "c", "gone"}, Options{Netns: ns})
	if err != nil || got["a"] != 3 || got["b"] != 1 || got["c"] != 0 || got["gone"] != -1 {
		t.Errorf("Chains = %v, %v; want a:3 b:1 c:0 gone:-1", got, err)
	}
	if got, err := Chains(IPv4, "missing", []string{"a"}, Options{Netns: ns}); err != nil || got["a"] != -1 {
		t.Errorf("Chains of a missing table = %v, %v; want a:-1", got, err)
	}

	seen, first := 0, ""
	err = Elements(IPv4, "t", "m", Options{Netns: ns}, func(e Element) error {
		if len(e.Key) != 8 || len(e.Value) != 8 || e.Verdict {
			return fmt.Errorf("element of %d-byte key, %d-byte value, verdict %v", len(e.Key), len(e.Value), e.Verdict)
		}
		if e.Value[0] != 10 || e.Value[1] != 200 || e.Value[4] != 8080>>8 || e.Value[5] != 8080&255 {
			return fmt.Errorf("value % x, want 10.200.0.1 . 8080", e.Value)
		}
		if seen == 0 {
			first = fmt.Sprintf("% x", e.Key)
		}
		seen++
		return nil
	})
	if err != nil || seen != n {
		t.Errorf("Elements: %d of %d (first key %s), %v", seen, n, first, err)
	}
	stop := fmt.Errorf("enough")
	calls := 0
	if err := Elements(IPv4, "t", "m", Options{Netns: ns}, func(Element) error { calls++; return stop }); err == nil || !strings.Contains(err.Error(), "enough") || calls != 1 {
		t.Errorf("Elements stopping at the first error = %v after %d calls", err, calls)
	}

	if c, err := Table(IPv4, "missing", o); err != nil || len(c.Rules)+len(c.Elems)+len(c.Sets) != 0 {
		t.Errorf("Table of a missing table = %+v, %v; want empty", c, err)
	}
	if err := Elements(IPv4, "t", "missing", Options{Netns: ns}, func(Element) error { return stop }); err != nil {
		t.Errorf("Elements of a missing set = %v", err)
	}
}

// TestCountAllocates: counting a map's elements keeps nothing of the
// dump: what it allocates does not grow with the map.
func TestCountAllocates(t *testing.T) {
	ns := netnstest.New(t, "vpnfalloc", "nft")
	bigTable(t, ns, 70_000)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	c, err := Table(IPv4, "t", Options{Netns: ns, Elements: true})
	runtime.ReadMemStats(&m1)
	if err != nil || c.Elems["m"] != 70_000 {
		t.Fatalf("Table = %v, %v", c.Elems, err)
	}
	// The dump is about 3 MB; materialized, it was allocated whole.
	if a := m1.TotalAlloc - m0.TotalAlloc; a > 512<<10 {
		t.Errorf("counting 70,000 elements allocated %d KB, want under 512", a>>10)
	}
}
