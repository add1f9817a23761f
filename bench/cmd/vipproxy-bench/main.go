//go:build linux

// Command vipproxy-bench measures vipproxy side by side with kube-proxy
// inside its own network namespaces (named vpbench-<pid>-…): cold start,
// programming latency, RSS and CPU, and first-packet latency through a VIP,
// for N Services × M endpoints. It prints one table and writes it as
// Markdown. It needs root.
//
//	go run ./bench/cmd/vipproxy-bench -n 1000,10000 \
//	    -targets vipproxy/nftables,vipproxy/iptables,kube-proxy/nftables \
//	    -kube-proxy "$(hack/kubeproxy.sh)/kube-proxy" -controlplane "$(hack/controlplane.sh)"
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vipproxy/vipproxy/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vipproxy-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		ns       = flag.String("n", "1000,10000", "comma-separated Service counts")
		m        = flag.Int("m", 10, "endpoints per Service")
		targets  = flag.String("targets", "vipproxy/nftables,vipproxy/iptables,vipproxy/userspace,vipproxy-api/nftables,kube-proxy/nftables,kube-proxy/iptables", "comma-separated PROXY/MODE: vipproxy (standalone, --manifests), vipproxy-api (Kubernetes mode) or kube-proxy, with nftables, iptables or userspace")
		changes  = flag.Int("changes", 50, "programming-latency changes per measurement")
		connects = flag.Int("connects", 300, "TCP connects per first-packet latency measurement")
		timeout  = flag.Duration("timeout", 5*time.Minute, "cap of each measurement (cold start; all changes together)")
		gap      = flag.Duration("change-gap", 1100*time.Millisecond, "pause after a change showed before the next one (longer than the proxies' default 1 s minSyncPeriod, so every change is a single change)")
		settle   = flag.Duration("settle", 30*time.Second, "longest wait for the proxy's CPU to go quiet before RSS/CPU are read")
		hog      = flag.Int("hog", 0, "busy-looping processes to run while the programming changes are measured (a loaded machine)")
		idle     = flag.Duration("idle", 0, "if > 0, read the RSS again this long after the RSS after the changes (the RSS idle column)")
		vip      = flag.String("vipproxy", "", "vipproxy binary (default: build ./cmd/vipproxy)")
		kp       = flag.String("kube-proxy", "", "kube-proxy binary (hack/kubeproxy.sh prints its directory); empty skips kube-proxy targets")
		cpDir    = flag.String("controlplane", "", "directory with etcd and kube-apiserver (hack/controlplane.sh prints it); empty skips Kubernetes-mode targets")
		workers  = flag.Int("api-workers", 32, "concurrent API writers when loading objects")
		apiLimit = flag.Int("api-limit", 10000, "largest N loaded through the API server (0: no limit)")
		out      = flag.String("out", "BENCHMARKS.md", "Markdown file to write (empty: none)")
		work     = flag.String("work", "", "work directory (default: a temporary one, removed)")
		verbose  = flag.Bool("v", false, "debug logging")
		profile  = flag.Duration("profile", 0, "if > 0, fetch a CPU profile this long from each vipproxy's start (--profiling) into the work directory (use with -work)")
		trace    = flag.Duration("trace", 0, "if > 0, fetch an execution trace this long from each vipproxy's start (--profiling) into the work directory (go tool trace; use with -work)")
		restart  = flag.Bool("restart", false, "after the changes, restart the proxy (vipproxy or kube-proxy) and measure its readiness, its first sync and failed connects (a client connects every 10 ms)")
		upgrade  = flag.String("restart-vipproxy", "", "with -restart: the vipproxy binary to restart into (an upgrade from -vipproxy); empty: the same")
		annotate = flag.String("annotate", "", "comma-separated key=value annotations set on every measured Service (e.g. vipproxy.io/lb-algorithm=consistent-hash,vipproxy.io/outlier-ejection=on)")
		half     = flag.Bool("annotate-half", false, "with -annotate: annotate half of the Services only, and measure the connect latency of the annotated and the plain ones in one interleaved loop (the plain ones in the note)")
		heap     = flag.Bool("heap", false, "fetch a heap profile (after a GC) from each vipproxy after its changes (--profiling) into the work directory (use with -work)")
	)
	flag.Parse()
	cfg := bench.Config{M: *m, Changes: *changes, Connects: *connects, Timeout: *timeout,
		ChangeGap: *gap, Settle: *settle, Idle: *idle, Hog: *hog, KubeProxy: *kp, ControlPlan: *cpDir,
		APIWorkers: *workers, APILimit: *apiLimit, Profile: *profile, Trace: *trace, Heap: *heap, Restart: *restart, RestartVipproxy: *upgrade, AnnotateHalf: *half}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	for _, kv := range strings.Split(*annotate, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("-annotate %q: want key=value", kv)
		}
		if cfg.Annotations == nil {
			cfg.Annotations = map[string]string{}
		}
		cfg.Annotations[k] = v
	}
	for _, s := range strings.Split(*ns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(strings.ReplaceAll(s, "_", "")))
		if err != nil || n < 2 || n > bench.MaxN {
			return fmt.Errorf("-n %q: want counts in [2, %d]", s, bench.MaxN)
		}
		cfg.Ns = append(cfg.Ns, n)
	}
	for _, s := range strings.Split(*targets, ",") {
		t, err := bench.ParseTarget(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		cfg.Targets = append(cfg.Targets, t)
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (it creates network namespaces)")
	}
	cfg.WorkDir = *work
	if cfg.WorkDir == "" {
		d, err := os.MkdirTemp("", "vipproxy-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		cfg.WorkDir = d
	}
	cfg.Vipproxy = *vip
	if cfg.Vipproxy == "" {
		cfg.Vipproxy = filepath.Join(cfg.WorkDir, "vipproxy")
		b := exec.Command("go", "build", "-o", cfg.Vipproxy, "./cmd/vipproxy")
		b.Stdout, b.Stderr = os.Stderr, os.Stderr
		if err := b.Run(); err != nil {
			return fmt.Errorf("building vipproxy (run from the repository root or pass -vipproxy): %w", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer bench.SweepOwn()

	start, load := time.Now(), bench.LoadAvg()
	machine := bench.Machine()
	if rev, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil && *vip == "" {
		machine += "; vipproxy built from commit " + strings.TrimSpace(string(rev))
	}
	if *kp != "" {
		if v, err := exec.Command(*kp, "--version").Output(); err == nil {
			machine += "; kube-proxy " + strings.TrimSpace(strings.TrimPrefix(string(v), "Kubernetes "))
		}
	}
	rs, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Println()
	bench.PrintTable(os.Stdout, rs)
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		cmd := "go run ./bench/cmd/vipproxy-bench " + strings.Join(os.Args[1:], " ")
		if err := bench.WriteReport(f, rs, machine+"; load average "+load+" at the start, "+bench.LoadAvg()+" at the end", cmd, start, time.Since(start)); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "wrote %s (%d CPUs)\n", *out, runtime.NumCPU())
	}
	return nil
}
