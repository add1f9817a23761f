//go:build linux

package e2e

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// TestDrain (issue 19, part 5): an established TCP connection to an
// endpoint that leaves its Service is reset after the grace period of
// vipproxy.io/drain: reset-after; without the annotation it goes on, as
// with kube-proxy. Modes that DNAT with conntrack (nftables, iptables);
// the userspace proxy owns its connections and ipvs its own table.
func TestDrain(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		if mode.Name == "userspace" || (mode.Name == "ipvs" && realIPVS()) {
			t.Skipf("drain reset works on conntrack DNAT; not in %s mode", mode.Name)
		}
		grace := Scaled(time.Second)
		docs := func(b *bed, withLeaving bool) []any {
			drained := Service("drained", "10.96.0.180", Port("http", TCP, 80, 8080))
			drained.Annotations = map[string]string{"vipproxy.io/drain": "reset-after=" + grace.String()}
			kept := Service("kept", "10.96.0.181", Port("http", TCP, 80, 8080))
			eps := allEPs(b.Topology)[:1] // pod1a stays
			if withLeaving {
				eps = append(eps, EP(b.Pod("pod2a")))
			}
			return []any{drained, Slice(drained, V4, "a", eps...), kept, Slice(kept, V4, "a", eps...)}
		}
		b := newBed(t, mode, bedOptions{Nodes: []int{1}, Before: func(b *bed) { b.apply("drain.yaml", docs(b, true)...) }})
		ns := b.Client
		// A connection to pod2a through each Service.
		hold := func(addr string) net.Conn {
			b.ready(ns, "tcp", addr)
			for range 100 {
				c, err := DialConn(ns, "tcp", addr, DialOptions{})
				if err != nil {
					t.Fatal(err)
				}
				c.SetDeadline(time.Now().Add(2 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				if r, perr := ParseReply(line); err == nil && perr == nil && r.Backend == "pod2a" {
					c.SetDeadline(time.Time{})
					t.Cleanup(func() { c.Close() })
					return c
				}
				c.Close()
			}
			t.Fatalf("no connection through %s reached pod2a", addr)
			return nil
		}
		drained, kept := hold("10.96.0.180:80"), hold("10.96.0.181:80")

		b.apply("drain.yaml", docs(b, false)...) // pod2a leaves both
		time.Sleep(grace + Scaled(2*time.Second))

		echo := func(c net.Conn) error {
			c.SetDeadline(time.Now().Add(Scaled(2 * time.Second)))
			if _, err := c.Write([]byte("ping\n")); err != nil {
				return err
			}
			got, err := bufio.NewReader(c).ReadString('\n')
			if err == nil && got != "ping\n" {
				t.Errorf("echo %q, want ping", got)
			}
			return err
		}
		if err := echo(kept); err != nil {
			t.Errorf("without a drain policy the connection to the endpoint that left broke: %v", err)
		}
		if err := echo(drained); err == nil {
			t.Errorf("with reset-after=%v the connection to the endpoint that left still works %v later", grace, grace+Scaled(2*time.Second))
		} else {
			t.Logf("drained connection ended: %v", err)
		}
		if line, ok := logLine(b.vp[0].Log(), "drain: reset the flows"); !ok {
			t.Errorf("no log line says flows were reset (%q)", line)
		}
	})
}
