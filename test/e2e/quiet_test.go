package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/vipproxy/vipproxy/internal/conntrack"
)

// TestQuietFlows (issue 19): while vipproxy reads conntrack events for
// outlier ejection only (nftables mode), the flows of a Service without it
// report no event at all, and those of the Service with it are sampled:
// the first ten a second and about one in eight beyond report their
// creation and assured state, none anything else while it lives. A
// backend that starts refusing is still ejected within 1 s (a refused
// flow reports its end), and from its first failure every flow of the
// Service reports: seen by a second listener on the node's conntrack
// table. vipproxy explain says which.
func TestQuietFlows(t *testing.T) {
	const watched, plain = "10.96.0.170:80", "10.96.0.171:80"
	b := newBed(t, modeSpecs["nftables"], bedOptions{Nodes: []int{1}, Before: func(b *bed) {
		w := Service("watched", "10.96.0.170", Port("http", TCP, 80, 8080))
		w.Annotations = map[string]string{"vipproxy.io/outlier-ejection": "on"}
		p := Service("plain", "10.96.0.171", Port("http", TCP, 80, 8080))
		b.apply("quiet.yaml", w, Slice(w, V4, "a", allEPs(b.Topology)...), p, Slice(p, V4, "a", allEPs(b.Topology)...))
	}})
	ns := b.Client
	b.ready(ns, "tcp", watched)
	b.ready(ns, "tcp", plain)

	h, err := netns.GetFromName(b.node(1).NS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ev, err := conntrack.SubscribeEvents(int(h), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()

	type tally struct{ created, assured, other int }
	// count polls the second listener for d and tallies the events of the
	// flows to watched and plain, but those of flows DNATed to old (a
	// backend no flow goes to any more); lost says some were dropped (its
	// buffer overflowed).
	var old netip.Addr
	count := func(d time.Duration, logOther bool) (w, p tally, lost bool) {
		seen := map[netip.AddrPort]*tally{netip.MustParseAddrPort(watched): &w, netip.MustParseAddrPort(plain): &p}
		for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			evs, err := ev.Poll()
			if errors.Is(err, syscall.ENOBUFS) {
				lost = true
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range evs {
				c := seen[e.Flow.OrigDst]
				switch {
				case c == nil:
				case old.IsValid() && e.Flow.ReplySrc.Addr() == old:
				case e.Type == conntrack.EventNew:
					c.created++
				case e.Type == conntrack.EventUpdate && e.Status&conntrack.StatusAssured != 0:
					c.assured++
				default:
					c.other++
					if !logOther {
						continue
					}
					t.Logf("%s: event %+v", e.Flow.OrigDst, e)
				}
			}
		}
		return w, p, lost
	}
	connect := func(addr string, n int) {
		for range n {
			if _, err := DialWith(ns, "tcp", addr, DialOptions{Timeout: Scaled(time.Second)}); err != nil {
				t.Fatalf("connect %s: %v", addr, err)
			}
		}
	}

	// Healthy: the watched Service's first ten flows report (the rate's
	// burst), then ten a second and one in eight of the others; the plain
	// one's none.
	const n = 200
	start := time.Now()
	connect(watched, n)
	took := time.Since(start)
	connect(plain, 20)
	w, p, lost := count(Scaled(time.Second), true)
	if lost {
		t.Fatal("the second listener lost events")
	}
	upper := min(n-1, 10+int(10*took.Seconds())+1+n/4)
	t.Logf("healthy: watched Service: %+v of %d flows in %v; plain Service: %+v", w, n, took.Round(time.Millisecond), p)
	if w.created < 10 || w.created > upper || w.assured != w.created || w.other != 0 {
		t.Errorf("watched Service: %+v of %d flows in %v; want 10 to %d created, as many assured, no other event", w, n, took, upper)
	}
	if p != (tally{}) {
		t.Errorf("plain Service's flows reported %+v; want no event", p)
	}

	// explain says so.
	for addr, want := range map[string]string{watched: "events:       sampled for outlier ejection", plain: "events:       none: silenced"} {
		out, err := Exec(b.node(1).NS, Binary(t), "explain", addr, "--metrics-address", MetricsAddr)
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("vipproxy explain %s: %v, lacks %q:\n%s", addr, err, want, out)
		}
	}

	// A backend refuses: ejected within 1 s, its refusals seen whether
	// sampled or not.
	victim := b.Pod("pod2a")
	victim.Backend.Close()
	stopped := time.Now()
	var seenAt time.Time
	// Driven only until the ejection: the endpoint is a suspect for the
	// window (10 s) from its last failure, which the checks below must
	// fall within on a slow (emulated) machine too.
	for seenAt.IsZero() && time.Since(stopped) < Scaled(1500*time.Millisecond) {
		drive(ns, watched, 100*time.Millisecond, func() {
			if line, ok := logLine(b.vp[0].Log(), "endpoint ejected"); ok && seenAt.IsZero() && strings.Contains(line, victim.IPv4+":8080") {
				seenAt = time.Now()
			}
		})
	}
	if seenAt.IsZero() || seenAt.Sub(stopped) > Scaled(time.Second) {
		t.Fatalf("%s refusing since %v: ejection logged at %v, want within %v", victim.Name, stopped, seenAt, Scaled(time.Second))
	}
	t.Logf("%s ejected %v after it stopped", victim.Name, seenAt.Sub(stopped).Round(time.Millisecond))

	// The ejection is logged before its rules are written, perhaps while
	// an earlier sync is writing (on an emulated machine each takes a
	// few hundred ms): the second sync logged after it began after it.
	// Syncs run every 2 s anyway.
	if _, err := eventually(Scaled(5*time.Second), 50*time.Millisecond, func() error {
		if n := linesAfter(b.vp[0].Log(), "endpoint ejected", `"synced"`); n < 2 {
			return fmt.Errorf("%d syncs logged after the ejection", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// It is a suspect for the window (10 s): every flow reports. The
	// flows it refused before its ejection report their end when their
	// CLOSE state times out (10 s), perhaps within the window below on a
	// slow machine: no new flow goes to it, so its flows are not counted.
	old = netip.MustParseAddr(victim.IPv4)
	count(200*time.Millisecond, false) // what the ejection's connects left queued
	connect(watched, 20)
	connected := time.Since(seenAt)
	if w, _, lost = count(Scaled(time.Second), true); lost {
		t.Fatal("the second listener lost events")
	}
	if out, err := Exec(b.node(1).NS, Binary(t), "explain", watched, "--metrics-address", MetricsAddr); err != nil || !strings.Contains(out, "events:       read for outlier ejection") {
		t.Errorf("vipproxy explain %s with a suspect endpoint: %v, lacks the read line:\n%s", watched, err, out)
	}
	t.Logf("with a suspect endpoint: watched Service: %+v of 20 flows (connected by %v after the ejection)", w, connected.Round(time.Millisecond))
	if w.created != 20 || w.assured != 20 || w.other != 0 {
		t.Errorf("watched Service with a suspect endpoint: %+v; want 20 created, 20 assured, no other event", w)
	}
}

// TestEjectionUnanswered (issue 19): a backend that stops answering SYNs
// (dropped in its namespace) is ejected, whether every flow reports its
// creation (per-endpoint metrics on) or only a sample does (ejection
// alone, nftables mode): the sample's first unanswered SYN makes the
// endpoint a suspect, after which every flow to it is seen. It prints how
// long each took.
func TestEjectionUnanswered(t *testing.T) {
	for _, v := range []struct {
		name string
		args []string
	}{
		{"sampled", nil},
		{"observed", []string{"--endpoint-metrics-services", "5"}},
	} {
		t.Run(v.name, func(t *testing.T) {
			const addr = "10.96.0.172:80"
			b := newBed(t, modeSpecs["nftables"], bedOptions{Nodes: []int{1}, ExtraArgs: v.args, Before: func(b *bed) {
				w := Service("silent", "10.96.0.172", Port("http", TCP, 80, 8080))
				w.Annotations = map[string]string{"vipproxy.io/outlier-ejection": "on"}
				b.apply("silent.yaml", w, Slice(w, V4, "a", allEPs(b.Topology)...))
			}})
			ns := b.Client
			b.ready(ns, "tcp", addr)
			victim := b.Pod("pod2a")
			if out, err := Exec(victim.NS, "nft", "add table inet blackhole; add chain inet blackhole in { type filter hook input priority 0; }; add rule inet blackhole in tcp dport 8080 drop"); err != nil {
				t.Fatalf("blackhole %s: %v: %s", victim.Name, err, out)
			}
			stopped := time.Now()
			var seenAt time.Time
			limit := Scaled(10 * time.Second)
			failed := 0
			for seenAt.IsZero() && time.Since(stopped) < limit {
				_, _, f := drive(ns, addr, 250*time.Millisecond, func() {
					if line, ok := logLine(b.vp[0].Log(), "endpoint ejected"); ok && seenAt.IsZero() && strings.Contains(line, victim.IPv4+":8080") {
						seenAt = time.Now()
					}
				})
				failed += f
			}
			if seenAt.IsZero() {
				t.Fatalf("%s silent: no ejection logged within %v (%d connects failed)", victim.Name, limit, failed)
			}
			line, _ := logLine(b.vp[0].Log(), "endpoint ejected")
			if !strings.Contains(line, "no reply") {
				t.Errorf("ejection reason: %s; want no reply", line)
			}
			t.Logf("%s: %s silent: ejection logged %v after (%d connects failed)", v.name, victim.Name,
				seenAt.Sub(stopped).Round(time.Millisecond), failed)
		})
	}
}

// linesAfter counts the occurrences of word in log after the first
// occurrence of marker (0 when marker is absent).
func linesAfter(log, marker, word string) int {
	_, rest, ok := strings.Cut(log, marker)
	if !ok {
		return 0
	}
	return strings.Count(rest, word)
}
