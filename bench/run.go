//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// Target is one proxy configuration to measure.
type Target struct {
	Proxy string // "vipproxy" or "kube-proxy"
	API   bool   // Kubernetes mode (real API server) rather than --manifests
	Mode  string // nftables, iptables, userspace
}

// String names the target as the -targets flag does: "vipproxy/nftables",
// "vipproxy-api/nftables", "kube-proxy/iptables".
func (t Target) String() string {
	p := t.Proxy
	if t.Proxy == "vipproxy" && t.API {
		p = "vipproxy-api"
	}
	return p + "/" + t.Mode
}

// ParseTarget parses a Target from its String form.
func ParseTarget(s string) (Target, error) {
	p, mode, ok := strings.Cut(s, "/")
	if !ok || mode == "" {
		return Target{}, fmt.Errorf("target %q: want PROXY/MODE", s)
	}
	switch p {
	case "vipproxy":
		switch mode {
		case "nftables", "iptables", "userspace", "ipvs":
			return Target{Proxy: p, Mode: mode}, nil
		}
	case "vipproxy-api":
		switch mode {
		case "nftables", "iptables", "userspace", "ipvs":
			return Target{Proxy: "vipproxy", API: true, Mode: mode}, nil
		}
	case "kube-proxy":
		switch mode {
		case "nftables", "iptables":
			return Target{Proxy: p, API: true, Mode: mode}, nil
		}
	default:
		return Target{}, fmt.Errorf("target %q: proxy %q: want vipproxy, vipproxy-api or kube-proxy", s, p)
	}
	return Target{}, fmt.Errorf("target %q: mode %q not supported for %s", s, mode, p)
}

// Config is one benchmark run.
type Config struct {
	Ns        []int // Service counts
	M         int   // endpoints per Service
	Changes   int   // programming-latency changes per measurement
	Connects  int   // connects per first-packet latency measurement
	Targets   []Target
	Timeout   time.Duration // cap of each measurement (cold start, all changes)
	ChangeGap time.Duration // pause after each change before the next
	Settle    time.Duration // at most this long waiting for the CPU to go quiet
	// Idle, if > 0, is how long the proxy is left alone after the RSS
	// after the changes is read before its RSS is read again (RSSIdle).
	Idle time.Duration
	// Hog is how many busy processes run while the changes are measured
	// (a loaded machine).
	Hog         int
	Vipproxy    string        // vipproxy binary
	KubeProxy   string        // kube-proxy binary ("" skips kube-proxy targets)
	ControlPlan string        // directory with etcd and kube-apiserver ("" skips API targets)
	APIWorkers  int           // concurrent API writers when loading
	APILimit    int           // largest N loaded through the API (0: no limit)
	Profile     time.Duration // if > 0, a vipproxy CPU profile this long from its start (cpu.pprof in the run directory)
	Heap        bool          // a vipproxy heap profile after the changes (heap.pprof in the run directory)
	Trace       time.Duration // if > 0, a vipproxy execution trace this long from its start (trace.out in the run directory)
	Restart     bool          // restart the proxy after the changes, measuring readiness and failed connects (vipproxy only)
	// RestartVipproxy, when set, is the binary the restart starts (an
	// upgrade from Vipproxy).
	RestartVipproxy string
	// Annotations are set on every Service of the measured sets (not the
	// baseline): e.g. vipproxy.io/lb-algorithm=consistent-hash to measure
	// first-packet latency with a feature on.
	Annotations map[string]string
	// AnnotateHalf puts the Annotations on half of the Services only
	// (Set.Annotated): Conn is then measured over the annotated probes
	// and ConnPlain over the others, interleaved in one loop, so that the
	// two are compared without the drift between runs.
	AnnotateHalf bool
	WorkDir      string
	Log          *slog.Logger
}

// Result is one target at one N. Zero durations with a Note mean "not
// measured"; TimedOut fields print as "> timeout".
type Result struct {
	Target    Target
	N         int
	Cold      time.Duration
	ColdTO    bool
	Load      time.Duration // API writes of all objects (Kubernetes mode)
	ProgN     int           // changes measured
	ProgP50   time.Duration
	ProgP99   time.Duration
	ProgTO    int    // changes that did not show within the cap
	RSS       uint64 // after the cold start, once the CPU went quiet
	RSSSteady uint64 // after the changes, once the CPU went quiet
	// ChangeCPU is the proxy's CPU (children included) from the first
	// change until the CPU went quiet after the last, per change.
	ChangeCPU time.Duration
	RSSIdle   uint64 // Config.Idle later
	RSSPeak   uint64 // the largest RSS until then (VmHWM)
	CPU       time.Duration
	Conn      Latency // first-packet latency with N Services
	Conn10    Latency // with the 10 baseline Services
	// ConnPlain is, with Config.AnnotateHalf, the first-packet latency of
	// the Services without the annotations (Conn: those with them).
	ConnPlain Latency
	Restart   Restart // with Config.Restart
	Note      string
}

// Latency is a TCP connect-time distribution.
type Latency struct {
	N        int
	P50, P99 time.Duration
}

// Run measures every target at every N and returns the results in order
// (N outer, targets inner). A failed measurement yields a Result with a
// Note; only setup errors (work directory, binaries) fail the run.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	base := map[Target]Latency{}
	var out []Result
	for _, n := range cfg.Ns {
		set := NewSet(n, cfg.M, cfg.Changes)
		set.Annotations, set.AnnotateHalf = cfg.Annotations, cfg.AnnotateHalf
		var standalone, api []Target
		for _, t := range cfg.Targets {
			if t.API {
				api = append(api, t)
			} else {
				standalone = append(standalone, t)
			}
		}
		if len(standalone) > 0 {
			dir := filepath.Join(cfg.WorkDir, fmt.Sprintf("manifests-%d", n))
			start := time.Now()
			if err := WriteSet(dir, set); err != nil {
				return out, err
			}
			baseDir := filepath.Join(cfg.WorkDir, "manifests-base")
			if err := WriteSet(baseDir, BaseSet(cfg.M)); err != nil {
				return out, err
			}
			cfg.Log.Info("manifests written", "n", n, "took", time.Since(start).Round(time.Millisecond))
			for _, t := range standalone {
				if _, ok := base[t]; !ok {
					base[t] = cfg.baseline(ctx, t, baseDir, nil)
				}
				r := cfg.measure(ctx, t, set, dir, nil)
				r.Conn10 = base[t]
				out = append(out, r)
				cfg.Log.Info("measured", "result", r.String())
			}
		}
		if len(api) > 0 {
			out = append(out, cfg.runAPI(ctx, api, set, base)...)
		}
	}
	return out, nil
}

func (cfg Config) runAPI(ctx context.Context, targets []Target, set *Set, base map[Target]Latency) []Result {
	var out []Result
	fail := func(note string) []Result {
		for _, t := range targets {
			out = append(out, Result{Target: t, N: set.N, Note: note})
		}
		return out
	}
	if cfg.ControlPlan == "" {
		return fail("no control plane binaries (hack/controlplane.sh)")
	}
	if cfg.APILimit > 0 && set.N > cfg.APILimit {
		return fail(fmt.Sprintf("skipped: N above -api-limit %d", cfg.APILimit))
	}
	dir := filepath.Join(cfg.WorkDir, fmt.Sprintf("controlplane-%d", set.N))
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(err.Error())
	}
	cp, err := StartControlPlane(cfg.ControlPlan, dir)
	if err != nil {
		cfg.Log.Error("control plane", "err", err)
		return fail("control plane failed: " + firstLine(err))
	}
	defer cp.Close()
	bs := BaseSet(cfg.M)
	if err := cp.Load(ctx, bs, 0, bs.N, 4); err != nil {
		return fail("loading: " + firstLine(err))
	}
	for _, t := range targets {
		if _, ok := base[t]; !ok && cfg.binary(t) != "" {
			base[t] = cfg.baseline(ctx, t, "", cp)
		}
	}
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, 4*cfg.Timeout)
	err = cp.Load(lctx, set, 0, set.N, cfg.APIWorkers)
	cancel()
	load := time.Since(start)
	cfg.Log.Info("objects loaded through the API", "n", set.N, "took", load.Round(time.Millisecond), "err", err)
	if err != nil {
		return fail("loading: " + firstLine(err))
	}
	for _, t := range targets {
		r := cfg.measure(ctx, t, set, "", cp)
		r.Load = load
		r.Conn10 = base[t]
		out = append(out, r)
		cfg.Log.Info("measured", "result", r.String())
	}
	return out
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

func (cfg Config) binary(t Target) string {
	if t.Proxy == "kube-proxy" {
		return cfg.KubeProxy
	}
	return cfg.Vipproxy
}

// proc prepares the proxy process for target t in bed b.
func (cfg Config) proc(t Target, b *Bed, manifests string, cp *ControlPlane, tag string) (*Proc, error) {
	dir := filepath.Join(cfg.WorkDir, "run-"+strings.ReplaceAll(t.String(), "/", "-")+"-"+tag)
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	bin := cfg.binary(t)
	if bin == "" {
		return nil, errors.New("no binary")
	}
	var args []string
	switch t.Proxy {
	case "vipproxy":
		args = []string{bin, "--proxy-mode", t.Mode, "--hostname-override", NodeName,
			"--cluster-cidr", ClusterCIDR, "--healthz-bind-address", "127.0.0.1:10256",
			"--metrics-bind-address", "127.0.0.1:10249"}
		if t.API {
			args = append(args, "--kubeconfig", cp.Kubeconfig)
		} else {
			args = append(args, "--manifests", manifests, "--state-dir", filepath.Join(dir, "state"),
				"--service-cluster-ip-range", ServiceCIDR)
		}
	case "kube-proxy":
		args = []string{bin, "--proxy-mode", t.Mode, "--hostname-override", NodeName,
			"--kubeconfig", cp.Kubeconfig, "--cluster-cidr", ClusterCIDR,
			"--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "127.0.0.1:10249",
			// The conntrack table size is global (not per namespace):
			// leave it and the timeouts alone.
			"--conntrack-max-per-core", "0",
			"--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0",
			"--v", "1"}
	}
	return newProc(t.String(), b.Node, filepath.Join(dir, "proxy.log"), args...), nil
}

// baseline measures first-packet latency with the 10 baseline Services.
func (cfg Config) baseline(ctx context.Context, t Target, manifests string, cp *ControlPlane) Latency {
	bs := BaseSet(cfg.M)
	control := ""
	if cp != nil {
		control = cp.NS
	}
	b, err := NewBed(control)
	if err != nil {
		cfg.Log.Error("baseline bed", "target", t, "err", err)
		return Latency{}
	}
	defer b.Close()
	p, err := cfg.proc(t, b, manifests, cp, "base")
	if err != nil {
		cfg.Log.Error("baseline", "target", t, "err", err)
		return Latency{}
	}
	if err := p.Start(); err != nil {
		cfg.Log.Error("baseline", "target", t, "err", err)
		return Latency{}
	}
	defer p.Stop(10 * time.Second)
	if _, ok := waitConnect(ctx, b.Dialer(), bs.VIP(bs.N-1), p.Started(), time.Now().Add(cfg.Timeout), p); !ok {
		cfg.Log.Error("baseline: last Service never answered", "target", t, "log", p.Tail(20))
		return Latency{}
	}
	cfg.settle(p)
	probes := make([]int, bs.N)
	for i := range probes {
		probes[i] = i
	}
	return connectLatency(b.Dialer(), bs, probes, cfg.Connects)
}

// measure runs one target at one N in a fresh bed.
func (cfg Config) measure(ctx context.Context, t Target, set *Set, manifests string, cp *ControlPlane) Result {
	r := Result{Target: t, N: set.N}
	if cfg.binary(t) == "" {
		r.Note = "no " + t.Proxy + " binary"
		return r
	}
	// Every change target starts dead.
	for _, i := range set.Changes {
		var err error
		if cp != nil {
			_, err = cp.SetSlice(ctx, set, i, false)
		} else {
			err = WriteChange(manifests, set, i, false)
		}
		if err != nil {
			r.Note = "reset: " + firstLine(err)
			return r
		}
	}
	control := ""
	if cp != nil {
		control = cp.NS
	}
	b, err := NewBed(control)
	if err != nil {
		r.Note = "bed: " + firstLine(err)
		return r
	}
	defer b.Close()
	p, err := cfg.proc(t, b, manifests, cp, fmt.Sprint(set.N))
	if err != nil {
		r.Note = err.Error()
		return r
	}
	profiling := (cfg.Profile > 0 || cfg.Trace > 0 || cfg.Heap) && t.Proxy != "kube-proxy"
	if profiling {
		p.Argv = append(p.Argv, "--profiling")
	}
	if err := p.Start(); err != nil {
		r.Note = firstLine(err)
		return r
	}
	defer p.Stop(10 * time.Second)
	if cfg.Profile > 0 && profiling {
		go cfg.fetch(b, p, fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(cfg.Profile.Seconds())),
			filepath.Join(filepath.Dir(p.LogPath), "cpu.pprof"), cfg.Profile+30*time.Second)
	}
	if cfg.Trace > 0 && profiling {
		go cfg.fetch(b, p, fmt.Sprintf("/debug/pprof/trace?seconds=%g", cfg.Trace.Seconds()),
			filepath.Join(filepath.Dir(p.LogPath), "trace.out"), cfg.Trace+30*time.Second)
	}

	// Cold start: process start → the last Service answers.
	cold, ok := waitConnect(ctx, b.Dialer(), set.VIP(set.N-1), p.Started(), time.Now().Add(cfg.Timeout), p)
	if !ok {
		r.ColdTO = true
		if !p.Running() {
			r.Note = "proxy exited: " + lastLine(p.Tail(5))
		}
		cfg.Log.Warn("cold start did not finish", "target", t, "n", set.N, "log", p.Tail(10))
		if u, err := ReadUsage(p.PID()); err == nil {
			r.RSS, r.CPU = u.RSS, u.CPU
		}
		return r
	}
	r.Cold = cold
	cfg.Log.Info("cold start", "target", t, "n", set.N, "took", cold.Round(time.Millisecond))

	// Settle, then RSS and CPU seconds.
	cfg.settle(p)
	if u, err := ReadUsage(p.PID()); err == nil {
		r.RSS, r.CPU = u.RSS, u.CPU
	}
	if set.AnnotateHalf {
		r.Conn, r.ConnPlain = splitLatency(b.Dialer(), set, set.Probes(), cfg.Connects, set.Annotated)
		r.Note = "connect p50 / p99 of the Services without the annotations: " + r.ConnPlain.String()
	} else {
		r.Conn = connectLatency(b.Dialer(), set, set.Probes(), cfg.Connects)
	}

	// Programming latency: write → first successful connect, with
	// cfg.Hog busy processes competing for the CPU.
	stopHog, err := startHog(cfg.Hog, cfg.Timeout+time.Minute)
	if err != nil {
		r.Note = firstLine(err)
		return r
	}
	var lat []time.Duration
	before, usageErr := ReadUsage(p.PID())
	budget := time.Now().Add(cfg.Timeout)
	for _, i := range set.Changes {
		if time.Now().After(budget) || ctx.Err() != nil {
			break
		}
		var start time.Time
		var err error
		if cp != nil {
			start, err = cp.SetSlice(ctx, set, i, true)
		} else {
			start = time.Now()
			err = WriteChange(manifests, set, i, true)
		}
		if err != nil {
			r.Note = "change: " + firstLine(err)
			break
		}
		d, ok := waitConnect(ctx, b.Dialer(), set.VIP(i), start, budget, p)
		if !ok {
			r.ProgTO++
			break
		}
		lat = append(lat, d)
		// One line per change, to set beside the proxy's log (which
		// Service, when, how long).
		cfg.Log.Info("change programmed", "service", i, "written", start.UTC().Format("15:04:05.000"), "took", d)
		time.Sleep(cfg.ChangeGap)
	}
	stopHog()
	r.ProgN = len(lat)
	if len(lat) > 0 {
		slices.Sort(lat)
		r.ProgP50, r.ProgP99 = pct(lat, 50), pct(lat, 99)
	}
	if !p.Running() && r.Note == "" {
		r.Note = "proxy exited: " + lastLine(p.Tail(5))
	}
	// Steady state: RSS after the changes, and where the heap goes.
	cfg.settle(p)
	if u, err := ReadUsage(p.PID()); err == nil && len(lat) > 0 {
		r.RSSSteady, r.RSSPeak = u.RSS, u.Peak
		if usageErr == nil {
			r.ChangeCPU = (u.CPU - before.CPU) / time.Duration(len(lat))
		}
		if cfg.Idle > 0 {
			time.Sleep(cfg.Idle)
			if u, err := ReadUsage(p.PID()); err == nil {
				r.RSSIdle, r.RSSPeak = u.RSS, u.Peak
			}
		}
	}
	if cfg.Heap && profiling {
		cfg.fetch(b, p, "/debug/pprof/heap?gc=1", filepath.Join(filepath.Dir(p.LogPath), "heap.pprof"), time.Minute)
	}
	if cfg.Restart && p.Running() {
		rs, next, err := cfg.restart(ctx, t, b, set, manifests, cp, p)
		if next != nil {
			defer next.Stop(10 * time.Second)
		}
		if err != nil {
			r.Note = firstLine(err)
		}
		r.Restart = rs
		cfg.Log.Info("restart", "target", t, "n", set.N, "result", rs.String())
	}
	return r
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// settle waits until the proxy's CPU time grows by less than 20 ms in
// 500 ms, or cfg.Settle passes.
func (cfg Config) settle(p *Proc) {
	deadline := time.Now().Add(cfg.Settle)
	prev, err := ReadUsage(p.PID())
	if err != nil {
		return
	}
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		u, err := ReadUsage(p.PID())
		if err != nil {
			return
		}
		if u.CPU-prev.CPU < 20*time.Millisecond {
			return
		}
		prev = u
	}
}

// waitConnect polls addr until a connect succeeds and returns the time from
// since to that success. It gives up at deadline, when ctx ends or when the
// proxy exits.
func waitConnect(ctx context.Context, d *Dialer, addr string, since, deadline time.Time, p *Proc) (time.Duration, bool) {
	for n := 0; ; n++ {
		_, err := d.Connect(addr, 50*time.Millisecond)
		if err == nil {
			return time.Since(since), true
		}
		if time.Now().After(deadline) || ctx.Err() != nil || (n%64 == 0 && !p.Running()) {
			return 0, false
		}
		time.Sleep(time.Millisecond)
	}
}

// connectLatency connects count times round-robin through the probes' VIPs
// and returns the connect-time distribution of the successful ones.
func connectLatency(d *Dialer, s *Set, probes []int, count int) Latency {
	all, _ := splitLatency(d, s, probes, count, func(int) bool { return true })
	return all
}

// splitLatency is connectLatency with the connects split by in(probe):
// the distribution of those in, and of the others.
func splitLatency(d *Dialer, s *Set, probes []int, count int, in func(int) bool) (yes, no Latency) {
	var lat [2][]time.Duration
	for k := 0; k < count && len(probes) > 0; k++ {
		i := probes[k%len(probes)]
		took, err := d.Connect(s.VIP(i), time.Second)
		if err == nil {
			j := 1
			if in(i) {
				j = 0
			}
			lat[j] = append(lat[j], took)
		}
	}
	return latencyOf(lat[0]), latencyOf(lat[1])
}

// latencyOf returns the distribution of lat (sorted in place).
func latencyOf(lat []time.Duration) Latency {
	if len(lat) == 0 {
		return Latency{}
	}
	slices.Sort(lat)
	return Latency{N: len(lat), P50: pct(lat, 50), P99: pct(lat, 99)}
}

// pct returns the p-th percentile (nearest rank) of sorted durations.
func pct(sorted []time.Duration, p int) time.Duration {
	i := (p*len(sorted) + 99) / 100
	if i < 1 {
		i = 1
	}
	return sorted[i-1]
}

// WriteSet writes set as manifests into dir (replacing it): chunk files of
// 500 Services with their EndpointSlices, and one file per change target so
// a change rewrites only a small file.
func WriteSet(dir string, set *Set) error {
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("manifests: %w", err)
	}
	const chunk = 500
	var docs []any
	flush := func(k int) error {
		if len(docs) == 0 {
			return nil
		}
		err := e2e.WriteManifest(dir, fmt.Sprintf("chunk-%04d.yaml", k), docs...)
		docs = docs[:0]
		return err
	}
	for i := 0; i < set.N; i++ {
		if set.IsChange(i) {
			if err := WriteChange(dir, set, i, false); err != nil {
				return err
			}
		} else {
			docs = append(docs, set.Service(i), set.Slice(i, false))
		}
		if (i+1)%chunk == 0 {
			if err := flush(i / chunk); err != nil {
				return err
			}
		}
	}
	return flush(set.N / chunk)
}

// WriteChange (re)writes change target i's file, live or dead.
func WriteChange(dir string, set *Set, i int, live bool) error {
	return e2e.WriteManifest(dir, "change-"+set.Name(i)+".yaml", set.Service(i), set.Slice(i, live))
}

// fetch GETs path from vipproxy's metrics server (--profiling) inside the
// bed as soon as it answers, and writes the body to file.
func (cfg Config) fetch(b *Bed, p *Proc, path, file string, timeout time.Duration) {
	d, err := NewDialer(b.Node)
	if err != nil {
		cfg.Log.Warn("fetch", "path", path, "err", err)
		return
	}
	defer d.Close()
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, _, err := d.Dial(addr, 2*time.Second)
			return c, err
		}}}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && p.Running(); time.Sleep(20 * time.Millisecond) {
		resp, err := client.Get("http://127.0.0.1:10249" + path)
		if err != nil {
			continue
		}
		defer resp.Body.Close()
		f, err := os.Create(file)
		if err != nil {
			cfg.Log.Warn("fetch", "path", path, "err", err)
			return
		}
		defer f.Close()
		n, err := io.Copy(f, resp.Body)
		cfg.Log.Info("profile written", "path", file, "bytes", n, "status", resp.StatusCode, "err", err)
		return
	}
}
