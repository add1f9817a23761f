//go:build linux

package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// drive dials addr from ns back to back (each bounded by 300 ms, scaled)
// for d
// and returns, per backend, the number of replies, the time of the last
// failed dial (zero if none), and each dial's outcome in order. every,
// when set, runs between dials (at most every 50 ms).
func drive(ns, addr string, d time.Duration, every func()) (counts map[string]int, lastFail time.Time, failed int) {
	counts = map[string]int{}
	end := time.Now().Add(d)
	var last time.Time
	for time.Now().Before(end) {
		r, err := DialWith(ns, "tcp", addr, DialOptions{Timeout: Scaled(300 * time.Millisecond)})
		if err != nil {
			lastFail = time.Now()
			failed++
		} else {
			counts[r.Backend]++
		}
		if every != nil && time.Since(last) >= 50*time.Millisecond {
			every()
			last = time.Now()
		}
	}
	return counts, lastFail, failed
}

var ejectedGauge = regexp.MustCompile(`(?m)^vipproxy_outlier_ejected_endpoints (\d+)`)

// ejectedNow reads vipproxy_outlier_ejected_endpoints from node's metrics.
func ejectedNow(t *testing.T, ns string) int {
	t.Helper()
	_, body, err := HTTPGet(ns, MetricsAddr, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m := ejectedGauge.FindStringSubmatch(body)
	if m == nil {
		return 0 // not set before the first ejection
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestOutlierEjection (issue 19, part 3): a backend that starts refusing
// connections is out of selection within 1 s, traffic moves to the
// healthy endpoints, no more than half of the endpoints are ejected when
// most of them fail, and an ejected endpoint comes back once it answers.
func TestOutlierEjection(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		// The first ejection outlasts the first phase, so that a failure
		// seen in it is one from before the ejection took effect.
		base := Scaled(3 * time.Second)
		b := newBed(t, mode, bedOptions{Nodes: []int{1}, ExtraArgs: []string{"--outlier-base-ejection", base.String(), "--endpoint-metrics-services", "5"}, Before: func(b *bed) {
			svc := Service("flaky", "10.96.0.160", Port("http", TCP, 80, 8080))
			svc.Annotations = map[string]string{"vipproxy.io/outlier-ejection": "on"}
			b.apply("flaky.yaml", svc, Slice(svc, V4, "a", allEPs(b.Topology)...))
		}})
		const addr = "10.96.0.160:80"
		ns, node := b.Client, b.node(1).NS
		b.ready(ns, "tcp", addr)
		if counts, _, failed := drive(ns, addr, 500*time.Millisecond, nil); failed > 0 || len(counts) != 4 {
			t.Fatalf("before: %v, %d failed; want all 4 backends, no failure", counts, failed)
		}

		victim := b.Pod("pod2a")
		victim.Backend.Close()
		stopped := time.Now()
		var seen time.Time
		logged := func() {
			if seen.IsZero() {
				if line, ok := logLine(b.vp[0].Log(), "endpoint ejected"); ok && strings.Contains(line, victim.IPv4+":8080") {
					seen = time.Now()
				}
			}
		}
		counts, lastFail, failed := drive(ns, addr, base*4/5, logged)
		if seen.IsZero() {
			t.Fatalf("no ejection of %s logged within %v (traffic %v, %d failed)", victim.Name, base*4/5, counts, failed)
		}
		detect := seen.Sub(stopped)
		moved := time.Duration(0)
		if !lastFail.IsZero() {
			moved = lastFail.Sub(stopped)
		}
		t.Logf("%s stopped answering: ejection logged after %v; last failed connection %v after (%d failed; then %v)",
			victim.Name, detect.Round(time.Millisecond), moved.Round(time.Millisecond), failed, counts)
		if detect > Scaled(time.Second) || moved > Scaled(time.Second) {
			t.Errorf("ejected after %v, connections failing until %v: want both within %v", detect, moved, Scaled(time.Second))
		}
		for _, p := range []string{"pod1a", "pod1b", "pod2b"} {
			if counts[p] == 0 {
				t.Errorf("no traffic moved to %s: %v", p, counts)
			}
		}

		// Three of four refuse: at most two (50%) are ejected.
		b.Pod("pod1b").Backend.Close()
		b.Pod("pod2b").Backend.Close()
		most := 0
		drive(ns, addr, Scaled(3*time.Second), func() { most = max(most, ejectedNow(t, node)) })
		// Sampled every 50 ms: an ejection that runs out frees its slot
		// until the endpoint fails again, so 2 is the most, not always.
		if most != 2 {
			t.Errorf("with 3 of 4 endpoints refusing, at most %d were ejected at once, want 2 (half) and never more", most)
		}

		// The victim answers again: it is back in selection after its
		// backoff (doubled each time it was ejected again meanwhile).
		for _, p := range []*Pod{victim, b.Pod("pod1b"), b.Pod("pod2b")} {
			be, err := StartBackend(p.NS, p.Name, BackendTCPPorts, BackendUDPPorts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(be.Close)
		}
		back := time.Now()
		b.waitFor(ns, "tcp", addr, Scaled(40*time.Second), backendIn(victim.Name))
		t.Logf("%s answers again: back in selection after %v", victim.Name, time.Since(back).Round(time.Millisecond))
		if line, ok := logLine(b.vp[0].Log(), "endpoint back in selection"); !ok {
			t.Errorf("no log line says an endpoint came back (%q)", line)
		}
		_, body, err := HTTPGet(node, MetricsAddr, "/metrics")
		if err != nil || !strings.Contains(body, `vipproxy_outlier_ejections_total{service_port="default/flaky:http/TCP"}`) {
			t.Errorf("metrics lack vipproxy_outlier_ejections_total for the Service (%v)", err)
		}
		// Per-endpoint connection metrics (--endpoint-metrics-services):
		// the victim's refused connections and a healthy endpoint's.
		series := func(name, pod string) float64 {
			re := regexp.MustCompile(name + `\{endpoint="` + regexp.QuoteMeta(b.Pod(pod).IPv4) + `:8080",service_port="default/flaky:http/TCP"\} (\S+)`)
			m := re.FindStringSubmatch(body)
			if m == nil {
				t.Errorf("no %s series for %s", name, pod)
				return 0
			}
			v, _ := strconv.ParseFloat(m[1], 64)
			return v
		}
		if n, f := series("vipproxy_endpoint_connections_total", "pod2a"), series("vipproxy_endpoint_failed_connections_total", "pod2a"); f < 3 || n < f {
			t.Errorf("pod2a: %v new and %v failed connections counted, want at least 3 failed", n, f)
		}
		if n, f := series("vipproxy_endpoint_connections_total", "pod1a"), series("vipproxy_endpoint_failed_connections_total", "pod1a"); n < 10 || f != 0 {
			t.Errorf("pod1a: %v new and %v failed connections counted, want many and none failed", n, f)
		}
	})
}
