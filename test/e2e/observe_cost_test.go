//go:build linux

package e2e

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// procCPU returns a process's user and system CPU time (/proc/PID/stat,
// clock ticks at 100 Hz).
func procCPU(t *testing.T, pid int) (user, sys time.Duration) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut) * 10 * time.Millisecond, time.Duration(st) * 10 * time.Millisecond
}

// machineBusy returns the CPU time all CPUs spent not idle (/proc/stat).
func machineBusy(t *testing.T) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	var busy int64
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		if i != 3 && i != 4 && i < 8 { // not idle, not iowait; no guest times (counted in user)
			busy += v
		}
	}
	return time.Duration(busy) * 10 * time.Millisecond
}

// TestObservationCost measures (it asserts nothing about speed, only that
// every connection went through; set VIPPROXY_E2E_COST=1 to run it: it takes
// half a minute) vipproxy's own CPU time while TCP connections are opened
// through one Service at 5,000 per second for 5 s, with conntrack observation
// off, for outlier ejection alone (sampled flows: each reports its end; the
// first 10 a second and one in eight of the rest report everything) and
// for ejection and per-endpoint metrics (every flow reports its creation,
// assured state and end). The servers are
// Sinks and the clients Load threads (blocking system calls, no Go poller), so
// the 2-core machine has room for the rate; the rate reached is printed with
// the cost. VIPPROXY_E2E_COST_RATE overrides the rate.
func TestObservationCost(t *testing.T) {
	if os.Getenv("VIPPROXY_E2E_COST") != "1" {
		t.Skip("a measurement: VIPPROXY_E2E_COST=1 runs it")
	}
	const sinkPort = 9090
	rate := 5000.0
	if v, err := strconv.ParseFloat(os.Getenv("VIPPROXY_E2E_COST_RATE"), 64); err == nil && v > 0 {
		rate = v
	}
	const d = 5 * time.Second
	for _, v := range []struct {
		name    string
		args    []string
		metrics bool
	}{
		{"off", nil, false},
		{"ejection", []string{"--outlier-ejection", "--profiling"}, false},
		{"ejection+metrics", []string{"--outlier-ejection", "--endpoint-metrics-services", "10", "--profiling"}, true},
	} {
		on, args := v.args != nil, v.args
		t.Run("observe="+v.name, func(t *testing.T) {
			b := newBed(t, modeSpecs["nftables"], bedOptions{Nodes: []int{1}, ExtraArgs: args, Before: func(b *bed) {
				svc := Service("busy", "10.96.0.190", Port("http", TCP, 80, sinkPort))
				b.apply("busy.yaml", svc, Slice(svc, V4, "a", allEPs(b.Topology)...))
			}})
			var sinks []*Sink
			for _, p := range b.Pods() {
				s, err := StartSink(p.NS, sinkPort)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(s.Close)
				sinks = append(sinks, s)
			}
			vipAddr := netip.MustParseAddrPort("10.96.0.190:80")
			if _, err := eventually(10*time.Second, 100*time.Millisecond, func() error {
				r, err := Load(b.Client, vipAddr, 100, 100*time.Millisecond, 1)
				if err == nil && r.Failed > 0 {
					err = fmt.Errorf("not ready: %v", r.Errors)
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
			pid := b.vp[0].PID()
			if on && os.Getenv("VIPPROXY_E2E_COST_PROFILE") != "" {
				go profileCPU(b, os.Getenv("VIPPROXY_E2E_COST_PROFILE"))
			}
			counted := func() float64 {
				if !v.metrics {
					return 0
				}
				n, err := metricSum(b.node(1).NS, "vipproxy_endpoint_connections_total")
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			counted0 := counted()
			u0, s0 := procCPU(t, pid)
			m0 := machineBusy(t)
			r, err := Load(b.Client, vipAddr, rate, d, 8)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond) // the last events
			u1, s1 := procCPU(t, pid)
			user, sys := u1-u0, s1-s0
			cpu := user + sys
			machine := machineBusy(t) - m0
			if r.Failed > 0 {
				t.Errorf("%d of %d connections failed: %v", r.Failed, r.OK+r.Failed, r.Errors)
			}
			if r.OK < 1000 {
				t.FailNow()
			}
			// Observation must keep up: every connection counted, no
			// event lost to a full socket.
			if n := counted() - counted0; v.metrics && int(n) != r.OK+r.Failed {
				t.Errorf("the per-endpoint metrics counted %v new connections, want %d", n, r.OK+r.Failed)
			}
			if lost, err := metricSum(b.node(1).NS, "vipproxy_outlier_conntrack_events_lost_total"); err != nil || lost != 0 {
				t.Errorf("conntrack event overflows: %v (%v)", lost, err)
			}
			var accepted int64
			for _, s := range sinks {
				accepted += s.Accepted.Load()
			}
			per1k := cpu / time.Duration(r.OK/1000)
			t.Logf("observation %s: %d connections in %v (%.0f/s, offered %.0f/s, %d accepted by the backends); vipproxy CPU %v (user %v, system %v) = %.1f%% of a core over the load, %v per 1,000 connections; whole machine busy %v = %.1f%% of a core",
				v.name, r.OK, r.Took.Round(time.Millisecond), r.Rate(), rate, accepted, cpu, user, sys, 100*cpu.Seconds()/r.Took.Seconds(), per1k,
				machine, 100*machine.Seconds()/(r.Took+500*time.Millisecond).Seconds())
		})
	}
}

// profileCPU saves a 4 s CPU profile of b's vipproxy to file.
func profileCPU(b *bed, file string) {
	c, err := DialConn(b.node(1).NS, "tcp", MetricsAddr, DialOptions{})
	if err != nil {
		return
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /debug/pprof/profile?seconds=4 HTTP/1.0\r\n\r\n")
	resp, err := io.ReadAll(c)
	if i := strings.Index(string(resp), "\r\n\r\n"); err == nil && i > 0 {
		os.WriteFile(file, resp[i+4:], 0o644)
	}
}
