//go:build linux

package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSlowStart (issue 19, part 4): an endpoint that joins a Service with
// vipproxy.io/slow-start gets a small share of new connections at first,
// growing to its full share over the slow-start time. Measured in windows
// of a sixth of it, from the external client.
func TestSlowStart(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		slow := Scaled(6 * time.Second)
		alg, _ := balancing(mode)
		var svcDocs func(b *bed, withNew bool) []any
		b := newBed(t, mode, bedOptions{Nodes: []int{1}, Before: func(b *bed) {
			svcDocs = func(b *bed, withNew bool) []any {
				svc := Service("ramp", "10.96.0.170", Port("http", TCP, 80, 8080))
				svc.Annotations = map[string]string{"vipproxy.io/slow-start": slow.String(), "vipproxy.io/lb-algorithm": alg}
				eps := allEPs(b.Topology)[:2] // pod1a, pod1b
				if withNew {
					eps = append(eps, EP(b.Pod("pod2a")))
				}
				return []any{svc, Slice(svc, V4, "a", eps...)}
			}
			b.apply("ramp.yaml", svcDocs(b, false)...)
		}})
		const addr = "10.96.0.170:80"
		ns := b.Client
		b.ready(ns, "tcp", addr)
		b.apply("ramp.yaml", svcDocs(b, true)...)
		window := slow / 6
		var shares []float64
		for range 8 {
			counts, _, failed := drive(ns, addr, window, nil)
			total := counts["pod1a"] + counts["pod1b"] + counts["pod2a"]
			if failed > 0 || total == 0 {
				t.Fatalf("window %d: %v, %d failed", len(shares), counts, failed)
			}
			shares = append(shares, float64(counts["pod2a"])/float64(total))
		}
		var line strings.Builder
		for i, s := range shares {
			line.WriteString(" " + (time.Duration(i+1) * window).String() + ":" + formatPct(s))
		}
		t.Logf("share of the new endpoint, per %v window after it joined (%v slow start, %s):%s",
			window, slow, alg, line.String())
		// Full share is 1/3; a tenth of a weight gives 1/21 (4.8%).
		if shares[0] > 0.15 || shares[1] > 0.22 {
			t.Errorf("shares %.1f%% and %.1f%% in the first two windows, want a ramp (< 15%%, < 22%%)", 100*shares[0], 100*shares[1])
		}
		if last := shares[len(shares)-1]; last < 0.25 {
			t.Errorf("share after the slow start %.1f%%, want about 33%%", 100*last)
		}
		if shares[3] <= shares[0] {
			t.Errorf("share did not grow: %v", shares)
		}
	})
}

func formatPct(f float64) string {
	return strings.TrimRight(strings.TrimRight(strconvFormat(100*f), "0"), ".") + "%"
}

func strconvFormat(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }
