package manifests

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestDefaultDebounce: the default quiet period fits the latency budget
// (p99 ≤ 50 ms from a write to traffic), and New applies it.
func TestDefaultDebounce(t *testing.T) {
	if DefaultDebounce > 10*time.Millisecond || DefaultDebounce <= 0 {
		t.Errorf("DefaultDebounce = %v; the 50 ms write-to-traffic budget leaves at most 10 ms for it", DefaultDebounce)
	}
	if got := New(Options{}).opts.Debounce; got != DefaultDebounce {
		t.Errorf("New(Options{}) debounce = %v, want %v", got, DefaultDebounce)
	}
}

// TestSourceBurstCap: a stream of writes that never leaves the directory
// quiet for Debounce still yields snapshots, at most source.MaxDebounces ×
// Debounce apart (here 10 × 10 ms; the test allows 10 times that for a
// loaded machine).
func TestSourceBurstCap(t *testing.T) {
	h := start(t, Options{Debounce: 10 * time.Millisecond}, map[string]string{"web.yaml": svcYAML("web", "10.96.0.10", 80)})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			// Atomic replace, as a ConfigMap volume or a careful writer does.
			if err := os.WriteFile(filepath.Join(h.dir, ".web.tmp"), []byte(svcYAML("web", "10.96.0.10", 1000+i%1000)), 0o644); err != nil {
				t.Error(err)
				return
			}
			if err := os.Rename(filepath.Join(h.dir, ".web.tmp"), filepath.Join(h.dir, "web.yaml")); err != nil {
				t.Error(err)
				return
			}
		}
	})
	defer wg.Wait()
	defer close(stop)
	for i := range 2 {
		select {
		case s := <-h.out:
			if p := servicePort(s, "web"); p < 1000 {
				t.Fatalf("snapshot %d: port %d, want a written one (≥ 1000)", i, p)
			}
		case <-time.After(time.Second):
			t.Fatalf("no snapshot within 1 s of a continuous stream of writes (snapshot %d)", i)
		}
	}
}

// TestEmptiedFileKeptWhileFresh: a file found empty moments after a write
// (truncated by an in-place rewrite, most likely) keeps its objects and
// asks for another look; once it is older than the burst cap, empty means
// empty.
func TestEmptiedFileKeptWhileFresh(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "web.yaml", svcYAML("web", "10.96.0.10", 80))
	s := New(Options{Dir: dir})
	ctx := context.Background()
	if snap := s.rescan(ctx, false); len(snap.Services) != 1 || s.recheck {
		t.Fatalf("first read: %d services, recheck %v", len(snap.Services), s.recheck)
	}
	write(t, dir, "web.yaml", "")
	if snap := s.rescan(ctx, false); len(snap.Services) != 1 || !s.recheck {
		t.Fatalf("freshly emptied: %d services, recheck %v; want the Service kept and a recheck", len(snap.Services), s.recheck)
	}
	old := time.Now().Add(-time.Second)
	if err := os.Chtimes(filepath.Join(dir, "web.yaml"), old, old); err != nil {
		t.Fatal(err)
	}
	if snap := s.rescan(ctx, false); len(snap.Services) != 0 || s.recheck {
		t.Fatalf("emptied a while ago: %d services, recheck %v; want none and no recheck", len(snap.Services), s.recheck)
	}
}
