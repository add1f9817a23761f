//go:build linux

package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs the whole benchmark at N = 50 for vipproxy's nftables mode
// and checks that every column was measured and is plausible.
func TestSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	t.Cleanup(SweepOwn)
	dir := t.TempDir()
	bin := filepath.Join(dir, "vipproxy")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/vipproxy").CombinedOutput(); err != nil {
		t.Fatalf("build vipproxy: %v\n%s", err, out)
	}
	cfg := Config{Ns: []int{50}, M: 10, Changes: 5, Connects: 50,
		Targets: []Target{{Proxy: "vipproxy", Mode: "nftables"}},
		Timeout: 20 * time.Second, ChangeGap: 100 * time.Millisecond, Settle: 3 * time.Second, Idle: 100 * time.Millisecond,
		Vipproxy: bin, WorkDir: filepath.Join(dir, "work"), Heap: true, Restart: true,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	rs, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 {
		t.Fatalf("got %d results, want 1", len(rs))
	}
	r := rs[0]
	t.Log(r)
	if r.Note != "" || r.ColdTO || r.Cold <= 0 || r.Cold > cfg.Timeout {
		t.Errorf("cold start = %v (timeout %v), note %q", r.Cold, r.ColdTO, r.Note)
	}
	if r.ProgN != 5 || r.ProgP50 <= 0 || r.ProgP99 < r.ProgP50 {
		t.Errorf("programming = %d changes, p50 %v, p99 %v; want 5 with 0 < p50 ≤ p99", r.ProgN, r.ProgP50, r.ProgP99)
	}
	if r.RSS < 1<<20 || r.RSSSteady < 1<<20 || r.RSSIdle < 1<<20 || r.CPU <= 0 {
		t.Errorf("RSS %d, after changes %d, idle %d, CPU %v: want all measured", r.RSS, r.RSSSteady, r.RSSIdle, r.CPU)
	}
	// The kernel's RSS counters are per-CPU and approximate (6.2 and
	// later): a VmHWM read after a VmRSS can be a few pages below it when
	// the RSS never grew again.
	if r.RSSPeak+1<<20 < max(r.RSS, r.RSSSteady, r.RSSIdle) {
		t.Errorf("peak RSS %d below RSS %d, after changes %d or idle %d", r.RSSPeak, r.RSS, r.RSSSteady, r.RSSIdle)
	}
	if r.ChangeCPU <= 0 {
		t.Errorf("CPU per change %v: want it measured", r.ChangeCPU)
	}
	heaps, _ := filepath.Glob(filepath.Join(cfg.WorkDir, "*", "heap.pprof"))
	if len(heaps) == 0 {
		heaps, _ = filepath.Glob(filepath.Join(cfg.WorkDir, "*", "*", "heap.pprof"))
	}
	if len(heaps) != 1 {
		t.Errorf("heap profiles %v under %s, want one", heaps, cfg.WorkDir)
	} else if b, err := os.ReadFile(heaps[0]); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("heap profile %s: not a gzipped pprof profile (err %v)", heaps[0], err)
	}
	if r.Conn.N != 50 || r.Conn10.N != 50 || r.Conn.P50 <= 0 || r.Conn10.P50 <= 0 {
		t.Errorf("connect latency N=%+v 10=%+v: want 50 successful connects each", r.Conn, r.Conn10)
	}
	// A restart adopts the tables: no connect fails while it happens.
	if r.Restart.Ready <= 0 || r.Restart.Synced <= 0 || r.Restart.Connects < 50 || r.Restart.Failed != 0 {
		t.Errorf("restart = %+v: want ready, 50+ connects, none failed", r.Restart)
	}
	// vipproxy stamps its sync before /healthz turns 200.
	if r.Restart.Synced > r.Restart.Ready {
		t.Errorf("restart synced %v after ready %v", r.Restart.Synced, r.Restart.Ready)
	}
	var md strings.Builder
	if err := WriteReport(&md, rs, Machine(), "test", time.Now(), time.Second); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"vipproxy/nftables", "| 50 |", "CPUs", "Linux"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), fmt.Sprintf("%s%d-", Prefix, os.Getpid())) {
			t.Errorf("namespace %s left behind", e.Name())
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
