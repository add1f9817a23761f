package manifests

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/source"
)

// writeBenchDir writes files×perFile Services, each with one EndpointSlice
// of 10 endpoints.
func writeBenchDir(b *testing.B, files, perFile int) string {
	b.Helper()
	dir := b.TempDir()
	n := 0
	for f := range files {
		var docs []string
		for range perFile {
			name := fmt.Sprintf("svc%05d", n)
			docs = append(docs, svcYAML(name, fmt.Sprintf("10.96.%d.%d", n/250, n%250+1), 80))
			eps := make([]string, 10)
			for e := range eps {
				eps[e] = fmt.Sprintf("10.%d.%d.%d", 100+n/65000, (n/250)%250, e+1)
			}
			docs = append(docs, strings.Replace(sliceYAML(name+"-1", name, eps[0]),
				fmt.Sprintf("[%q]", eps[0]), "[\""+strings.Join(eps, "\"]\n- addresses: [\"")+"\"]", 1))
			n++
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d.yaml", f)), []byte(join(docs...)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// BenchmarkColdRead: read and decode a directory of 1,000 Services (10
// files × 100), merge and assemble the snapshot.
func BenchmarkColdRead1000(b *testing.B) { benchCold(b, 10, 100) }

// BenchmarkColdRead10000: the same for 10,000 Services (100 files × 100).
func BenchmarkColdRead10000(b *testing.B) { benchCold(b, 100, 100) }

// BenchmarkCachedRead10000 is BenchmarkColdRead10000 for a restart: every
// file's decode comes from the cache a first read wrote.
func BenchmarkCachedRead10000(b *testing.B) { benchRead(b, 100, 100, true) }

func benchCold(b *testing.B, files, perFile int) { benchRead(b, files, perFile, false) }

func benchRead(b *testing.B, files, perFile int, cached bool) {
	dir := writeBenchDir(b, files, perFile)
	opts := Options{Dir: dir}
	if cached {
		opts.CacheFile, opts.CacheVersion = filepath.Join(b.TempDir(), "manifests.cache"), "bench"
		s := New(opts)
		s.rescan(context.Background(), true)
		if err := s.writeCache(s.firstRead); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	var cpu time.Duration
	for range b.N {
		c0 := cpuTime()
		s := New(opts)
		s.cache = s.loadCache()
		snap := s.rescan(context.Background(), true)
		if cached && s.cacheHits != files {
			b.Fatalf("%d of %d files from the cache", s.cacheHits, files)
		}
		cpu += cpuTime() - c0
		if len(snap.Services) != files*perFile || len(snap.Problems) != 0 {
			b.Fatalf("%d services, %d problems", len(snap.Services), len(snap.Problems))
		}
	}
	reportCPU(b, cpu)
}

// cpuTime is the CPU time (user + system, all threads) this process used
// so far. Wall-clock ns/op on a shared machine includes waiting for a
// core; cpu-ns/op does not.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, cpu time.Duration) {
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// BenchmarkOneChange10000: one file of a 10,000-Service directory changes;
// re-read and assemble the snapshot (what a single edit costs).
func BenchmarkOneChange10000(b *testing.B) {
	dir := writeBenchDir(b, 100, 100)
	s := New(Options{Dir: dir})
	s.rescan(context.Background(), true)
	path := filepath.Join(dir, "f0000.yaml")
	orig, _ := os.ReadFile(path)
	b.ResetTimer()
	var cpu time.Duration
	for i := range b.N {
		data := strings.Replace(string(orig), "port: 80\n", fmt.Sprintf("port: %d\n", 1000+i%1000), 1)
		b.StopTimer() // the write is the editor's cost, not ours
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		c0 := cpuTime()
		snap := s.rescan(context.Background(), false)
		cpu += cpuTime() - c0
		if len(snap.Services) != 10000 {
			b.Fatalf("%d services", len(snap.Services))
		}
	}
	reportCPU(b, cpu)
}

// BenchmarkUnchanged10000: Run compares every new snapshot with the last
// one sent (to drop identical ones); this is that comparison at 10,000
// Services after a change in the last file (the worst case).
func BenchmarkUnchanged10000(b *testing.B) {
	dir := writeBenchDir(b, 100, 100)
	s := New(Options{Dir: dir})
	a := s.rescan(context.Background(), true)
	path := filepath.Join(dir, "f0099.yaml")
	orig, _ := os.ReadFile(path)
	if err := os.WriteFile(path, []byte(strings.Replace(string(orig), "port: 80\n", "port: 81\n", 1)), 0o644); err != nil {
		b.Fatal(err)
	}
	c := s.rescan(context.Background(), false)
	b.ResetTimer()
	for range b.N {
		if snapshotsEqual(a, c) {
			b.Fatal("equal")
		}
	}
}

// BenchmarkRetained10000 reports the heap a Source keeps after a cold
// read of 10,000 Services (retained-B/op, measured after runtime.GC with
// the Source and its snapshot alive), and the heap spans in use then
// (inuse-B/op).
func BenchmarkRetained10000(b *testing.B) { benchRetained(b, nil) }

// BenchmarkRetainedAssigned10000 is BenchmarkRetained10000 with an
// Assigner (vipproxy has one unless --service-cluster-ip-range is
// empty); every Service names its ClusterIP, as the bench's do.
func BenchmarkRetainedAssigned10000(b *testing.B) {
	benchRetained(b, func() source.Assigner {
		return &batchAssigner{fakeAssigner: &fakeAssigner{assigned: map[model.ServiceName]netip.Addr{}}}
	})
}

func benchRetained(b *testing.B, assigner func() source.Assigner) {
	dir := writeBenchDir(b, 100, 100)
	b.ResetTimer()
	var retained, inuse uint64
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		opts := Options{Dir: dir}
		if assigner != nil {
			opts.Assigner = assigner()
		}
		s := New(opts)
		snap := s.rescan(context.Background(), true)
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(s)
		runtime.KeepAlive(snap)
		retained += after.HeapAlloc - before.HeapAlloc
		inuse += after.HeapInuse - before.HeapInuse
	}
	b.ReportMetric(float64(retained)/float64(b.N), "retained-B/op")
	// The spans the retained objects keep in use: more than retained-B/op
	// by what the garbage of the read left half-empty.
	b.ReportMetric(float64(inuse)/float64(b.N), "inuse-B/op")
}

// BenchmarkSnapshotCopy10000: the part of a one-file change that the
// Snapshot type forces: copying the Services and Slices arrays (values)
// of a 10,000-Service snapshot.
func BenchmarkSnapshotCopy10000(b *testing.B) {
	dir := writeBenchDir(b, 100, 100)
	snap := New(Options{Dir: dir}).rescan(context.Background(), true)
	b.ResetTimer()
	for range b.N {
		c := &model.Snapshot{Services: slices.Clone(snap.Services), Slices: slices.Clone(snap.Slices)}
		if len(c.Services) != 10000 {
			b.Fatal(len(c.Services))
		}
	}
}
