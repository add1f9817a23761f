//go:build linux

package e2e

import (
	"bufio"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// balancing is what a mode does with vipproxy.io/lb-algorithm: the
// algorithm to weigh endpoints with (random, or round-robin where the mode
// has no random choice) and whether it hashes sources.
func balancing(mode modeSpec) (weighted string, hash bool) {
	switch {
	case mode.Name == "ipvs" && realIPVS():
		return "round-robin", true // wrr, mh
	case mode.Name == "nftables" || mode.Name == "userspace":
		return "random", true
	}
	return "random", false // iptables (and ipvs falling back to it)
}

// sourceAddrs gives the client n more addresses (192.168.80.1 on, /32 each)
// and routes them back from node1, for tests that need many clients.
func sourceAddrs(t *testing.T, b *bed, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	cmds := make([]string, n)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("192.168.%d.%d", 80+(i+1)/256, (i+1)%256)
		cmds[i] = "addr add " + addrs[i] + "/32 dev eth0"
	}
	if err := IPBatch(b.Client, cmds); err != nil {
		t.Fatal(err)
	}
	if err := IPBatch(b.node(1).NS, []string{"route add 192.168.80.0/22 via " + ClientIP}); err != nil {
		t.Fatal(err)
	}
	return addrs
}

// TestBalancing: per-Service balancing (issue 19 part 4) with real traffic
// through node1 from the external client.
//
//   - round-robin: 30 connections cycle through the 3 endpoints in a fixed
//     order, each exactly 10 times;
//   - weights: over 10,000 connections, endpoints weighing 2 and 3 get
//     40% and 60% of them, each within ±5% of its share;
//   - consistent-hash: 1,000 client addresses each keep their endpoint
//     while it exists; removing one of 4 endpoints moves at most
//     1/4 + 5% of them (its own and at most 5% more);
//   - a mode without source hashing (iptables) refuses consistent-hash by
//     name and serves the Service with its default.
func TestBalancing(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		weighted, hash := balancing(mode)
		var hashSvc *hashService
		b := newBed(t, mode, bedOptions{Nodes: []int{1}, Before: func(b *bed) {
			p1a, p1b, p2a, p2b := b.Pod("pod1a"), b.Pod("pod1b"), b.Pod("pod2a"), b.Pod("pod2b")
			rr := Service("rr", "10.96.0.150", Port("http", TCP, 80, 8080))
			rr.Annotations = map[string]string{"vipproxy.io/lb-algorithm": "round-robin"}
			w := Service("weighted", "10.96.0.151", Port("http", TCP, 80, 8080))
			w.Annotations = map[string]string{"vipproxy.io/lb-algorithm": weighted}
			heavy, light := Slice(w, V4, "a", EP(p1a)), Slice(w, V4, "b", EP(p2a))
			light.Annotations = map[string]string{"vipproxy.io/weight": "2"}
			heavy.Annotations = map[string]string{"vipproxy.io/weight": "3"}
			h := Service("hash", "10.96.0.152", Port("http", TCP, 80, 8080))
			h.Annotations = map[string]string{"vipproxy.io/lb-algorithm": "consistent-hash"}
			hashSvc = &hashService{h, []discoveryv1.Endpoint{EP(p1a), EP(p1b), EP(p2a), EP(p2b)}}
			b.apply("balance.yaml", rr, Slice(rr, V4, "a", EP(p1a), EP(p1b), EP(p2a)), w, heavy, light,
				h, Slice(h, V4, "a", hashSvc.eps...))
		}})
		ns := b.Client
		for _, a := range []string{"10.96.0.150:80", "10.96.0.151:80", "10.96.0.152:80"} {
			b.ready(ns, "tcp", a)
		}

		t.Run("round-robin", func(t *testing.T) {
			var seq []string
			for range 30 {
				r, err := Dial(ns, "tcp", "10.96.0.150:80")
				if err != nil {
					t.Fatal(err)
				}
				seq = append(seq, r.Backend)
			}
			count := map[string]int{}
			for i, s := range seq {
				count[s]++
				if i >= 3 && s != seq[i-3] {
					t.Fatalf("connection %d went to %s, connection %d to %s: not a fixed rotation: %v", i, s, i-3, seq[i-3], seq)
				}
			}
			if len(count) != 3 || count["pod1a"] != 10 || count["pod1b"] != 10 || count["pod2a"] != 10 {
				t.Errorf("30 connections per backend %v, want 10 each; sequence %v", count, seq)
			}
			t.Logf("round-robin order %v", seq[:6])
		})

		t.Run("weights", func(t *testing.T) {
			const n = 10000
			start := time.Now()
			got := spread(ns, "tcp", "10.96.0.151:80", n, 8)
			t.Logf("%d connections in %v (%s): %v", n, time.Since(start).Round(time.Millisecond), weighted, got)
			for name, want := range map[string]int{"pod1a": n * 3 / 5, "pod2a": n * 2 / 5} {
				if d := float64(got[name])/float64(want) - 1; d > 0.05 || d < -0.05 {
					t.Errorf("%s got %d of %d connections, want %d ±5%%", name, got[name], n, want)
				}
			}
			if got["pod1a"]+got["pod2a"] != n {
				t.Errorf("connections failed or went elsewhere: %v", got)
			}
		})

		t.Run("explain", func(t *testing.T) {
			// Hold connections open through the VIP, then ask the running
			// instance which endpoints the client can reach.
			held := map[string]int{}
			for range 4 {
				c, err := DialConn(ns, "tcp", "10.96.0.151:80", DialOptions{})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(Scaled(5 * time.Second)))
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				r, err := ParseReply(line)
				if err != nil {
					t.Fatal(err)
				}
				held[r.Backend]++
			}
			out, err := Exec(b.node(1).NS, Binary(t), "explain", "10.96.0.151:80", "--from", ClientIP, "--metrics-address", MetricsAddr)
			if err != nil {
				t.Fatalf("vipproxy explain: %v\n%s", err, out)
			}
			t.Logf("vipproxy explain 10.96.0.151:80 --from %s:\n%s", ClientIP, out)
			for _, want := range []string{"service port: default/weighted:http/TCP (clusterIP)", "balancing:    " + weighted,
				"masquerade:   yes (", "DNAT to one of 2 endpoint(s)"} {
				if !strings.Contains(out, want) {
					t.Errorf("explain output lacks %q", want)
				}
			}
			for _, p := range []*Pod{b.Pod("pod1a"), b.Pod("pod2a")} {
				var line string
				for _, l := range strings.Split(out, "\n") {
					if strings.Contains(l, " "+p.IPv4+":8080 ") {
						line = l
					}
				}
				var conns int
				if i := strings.Index(line, "conns "); i < 0 || !strings.HasPrefix(strings.TrimSpace(line), "+") {
					t.Errorf("%s: no eligible endpoint line in the output", p.Name)
					continue
				} else if _, err := fmt.Sscanf(line[i:], "conns %d", &conns); err != nil {
					t.Errorf("%s: %q: %v", p.Name, line, err)
					continue
				}
				// At least the held ones (the node may hold other live
				// flows to the endpoint in userspace mode).
				if conns < held[p.Name] {
					t.Errorf("%s: explain counts %d live connections, %d are held open", p.Name, conns, held[p.Name])
				}
			}
		})

		t.Run("consistent-hash", func(t *testing.T) {
			if !hash {
				line, ok := logLine(b.vp[0].Log(), "vipproxy.io/lb-algorithm")
				if !ok || !strings.Contains(line, "consistent-hash") {
					t.Fatalf("%s mode: no log line refusing vipproxy.io/lb-algorithm consistent-hash (got %q)", mode.Name, line)
				}
				b.ready(ns, "tcp", "10.96.0.152:80") // still served, by the default
				return
			}
			srcs := sourceAddrs(t, b, 1000)
			// Each dial from a source uses a source port of its own
			// (pass): a fresh 4-tuple, so that no TIME_WAIT or IPVS
			// connection entry of an earlier dial can answer it.
			pass := 0
			dialFrom := func(src string) string {
				r, err := DialWith(ns, "tcp", "10.96.0.152:80", DialOptions{Source: src, SourcePort: 31000 + pass})
				if err != nil {
					t.Fatalf("from %s:%d: %v", src, 31000+pass, err)
				}
				return r.Backend
			}
			before := make([]string, len(srcs))
			count := map[string]int{}
			for i, s := range srcs {
				before[i] = dialFrom(s)
				count[before[i]]++
			}
			t.Logf("1,000 sources over 4 endpoints: %v", count)
			pass++
			for i, s := range srcs[:200] {
				if again := dialFrom(s); again != before[i] {
					t.Fatalf("source %s went to %s, then to %s", s, before[i], again)
				}
			}
			for name, c := range count {
				if c < 150 || c > 350 {
					t.Errorf("%s got %d of 1,000 sources, want about 250", name, c)
				}
			}
			// pod2b goes.
			b.apply("balance.yaml", hashSvc.svc, Slice(hashSvc.svc, V4, "a", hashSvc.eps[:3]...))
			var onGone []string
			for i, s := range srcs {
				if before[i] == "pod2b" {
					onGone = append(onGone, s)
				}
			}
			if _, err := eventually(Scaled(10*time.Second), 50*time.Millisecond, func() error {
				pass++
				for _, s := range onGone {
					if got := dialFrom(s); got == "pod2b" {
						return fmt.Errorf("%s still reaches pod2b", s)
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			moved, movedOthers := 0, 0
			pass++
			for i, s := range srcs {
				if got := dialFrom(s); got != before[i] {
					moved++
					if before[i] != "pod2b" {
						movedOthers++
					}
				}
			}
			t.Logf("removing 1 of 4 endpoints moved %d of 1,000 sources (%d of them from the 3 remaining endpoints)", moved, movedOthers)
			if limit := 1000/4 + 50; moved > limit {
				t.Errorf("removing 1 of 4 endpoints moved %d of 1,000 sources, want ≤ %d (1/N + 5%%)", moved, limit)
			}
		})
	})
}

// hashService is the consistent-hash Service and its endpoints, for
// rewriting its manifest without one of them.
type hashService struct {
	svc *corev1.Service
	eps []discoveryv1.Endpoint
}
