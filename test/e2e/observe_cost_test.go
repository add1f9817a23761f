//go:build linux

package e2e

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// procCPU returns a process's user+system CPU time (/proc/PID/stat,
// clock ticks at 100 Hz).
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// TestObservationCost measures (it asserts nothing about speed, only that
// every connection went through; set VIPPROXY_E2E_COST=1 to run it: it
// takes half a minute, and minutes in the QEMU guests) vipproxy's own CPU time while 20,000 TCP
// connections go through one Service, with conntrack observation off and
// on (outlier ejection and per-endpoint metrics), and prints the cost per
// 1,000 connections and what it comes to at 5,000 connections/s.
func TestObservationCost(t *testing.T) {
	if os.Getenv("VIPPROXY_E2E_COST") != "1" {
		t.Skip("a measurement: VIPPROXY_E2E_COST=1 runs it")
	}
	const n = 20000
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("observe=%v", on), func(t *testing.T) {
			var args []string
			if on {
				args = []string{"--outlier-ejection", "--endpoint-metrics-services", "10", "--profiling"}
			}
			b := newBed(t, modeSpecs["nftables"], bedOptions{Nodes: []int{1}, ExtraArgs: args, Before: func(b *bed) {
				svc := Service("busy", "10.96.0.190", Port("http", TCP, 80, 8080))
				b.apply("busy.yaml", svc, Slice(svc, V4, "a", allEPs(b.Topology)...))
			}})
			b.ready(b.Client, "tcp", "10.96.0.190:80")
			time.Sleep(time.Second)
			pid := b.vp[0].PID()
			cpu0, start := procCPU(t, pid), time.Now()
			if on && os.Getenv("VIPPROXY_E2E_COST_PROFILE") != "" {
				go func() {
					c, err := DialConn(b.node(1).NS, "tcp", MetricsAddr, DialOptions{})
					if err != nil {
						return
					}
					defer c.Close()
					fmt.Fprintf(c, "GET /debug/pprof/profile?seconds=6 HTTP/1.0\r\n\r\n")
					resp, err := io.ReadAll(c)
					if i := strings.Index(string(resp), "\r\n\r\n"); err == nil && i > 0 {
						os.WriteFile(os.Getenv("VIPPROXY_E2E_COST_PROFILE"), resp[i+4:], 0o644)
					}
				}()
			}
			got := spread(b.Client, "tcp", "10.96.0.190:80", n, 8)
			took := time.Since(start)
			time.Sleep(500 * time.Millisecond) // the last events
			cpu := procCPU(t, pid) - cpu0
			ok := 0
			for k, v := range got {
				if !strings.HasPrefix(k, "error") {
					ok += v
				}
			}
			if ok != n {
				t.Errorf("%d of %d connections failed: %v", n-ok, n, got)
			}
			if ok < 1000 {
				t.FailNow()
			}
			rate := float64(ok) / took.Seconds()
			per1k := cpu / time.Duration(ok/1000)
			t.Logf("observation %v: %d connections in %v (%.0f/s); vipproxy CPU %v, %v per 1,000 connections, %.1f%% of a core at 5,000/s",
				on, ok, took.Round(time.Millisecond), rate, cpu, per1k, 100*5*per1k.Seconds())
		})
	}
}
