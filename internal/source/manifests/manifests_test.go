package manifests

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

// waitLimit bounds every wait for a snapshot.
const waitLimit = 10 * time.Second

func svcYAML(name, ip string, port int) string {
	clusterIP := ""
	if ip != "" {
		clusterIP = "\n  clusterIP: " + ip
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: %s
spec:%s
  ports:
  - name: http
    port: %d
`, name, clusterIP, port)
}

func sliceYAML(name, svc, ip string) string {
	return fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %s
  labels:
    kubernetes.io/service-name: %s
addressType: IPv4
ports:
- name: http
  port: 8080
endpoints:
- addresses: [%q]
`, name, svc, ip)
}

func join(docs ...string) string { return strings.Join(docs, "---\n") }

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// harness runs a Source over a fresh directory.
type harness struct {
	t    *testing.T
	dir  string
	out  chan *model.Snapshot
	last *model.Snapshot
}

// start writes files, runs a Source and waits for its first snapshot.
func start(t *testing.T, opts Options, files map[string]string) *harness {
	t.Helper()
	h := &harness{t: t, dir: t.TempDir(), out: make(chan *model.Snapshot)}
	for n, c := range files {
		write(t, h.dir, n, c)
	}
	opts.Dir = h.dir
	if opts.Debounce == 0 {
		opts.Debounce = 20 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- New(opts).Run(ctx, h.out) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitLimit):
			t.Error("Run did not return after cancel")
		}
	})
	h.next()
	return h
}

// next returns the next snapshot, failing the test after waitLimit.
func (h *harness) next() *model.Snapshot {
	h.t.Helper()
	select {
	case s := <-h.out:
		h.last = s
		return s
	case <-time.After(waitLimit):
		h.t.Fatalf("no snapshot within %v", waitLimit)
		return nil
	}
}

// until reads snapshots until cond holds, failing after waitLimit. Every
// snapshot read on the way is passed to each (if non-nil) first.
func (h *harness) until(what string, cond func(*model.Snapshot) bool, each func(*model.Snapshot)) *model.Snapshot {
	h.t.Helper()
	if h.last != nil && cond(h.last) {
		return h.last
	}
	deadline := time.After(waitLimit)
	for {
		select {
		case s := <-h.out:
			h.last = s
			if each != nil {
				each(s)
			}
			if cond(s) {
				return s
			}
		case <-deadline:
			h.t.Fatalf("timed out waiting for %s; last snapshot: %s", what, describe(h.last))
			return nil
		}
	}
}

// quiet asserts that no snapshot arrives for d.
func (h *harness) quiet(d time.Duration) {
	h.t.Helper()
	select {
	case s := <-h.out:
		h.t.Fatalf("unexpected snapshot: %s", describe(s))
	case <-time.After(d):
	}
}

// describe renders the parts of a snapshot tests look at.
func describe(s *model.Snapshot) string {
	if s == nil {
		return "<nil>"
	}
	var b strings.Builder
	for _, svc := range s.Services {
		fmt.Fprintf(&b, "svc %s %v", svc.ServiceName, svc.ClusterIPs)
		for _, p := range svc.Ports {
			fmt.Fprintf(&b, " %s:%d/%d", p.Name, p.Port, p.NodePort)
		}
		b.WriteString("; ")
	}
	for _, sl := range s.Slices {
		fmt.Fprintf(&b, "slice %s/%s; ", sl.Service.Namespace, sl.Name)
	}
	if s.Node != nil {
		fmt.Fprintf(&b, "node %s zone=%s; ", s.Node.Name, s.Node.Zone())
	}
	for _, p := range s.Problems {
		fmt.Fprintf(&b, "problem [%s]; ", p.Error())
	}
	return b.String()
}

func findService(s *model.Snapshot, name string) *model.Service {
	for i := range s.Services {
		if s.Services[i].Name == name {
			return s.Services[i]
		}
	}
	return nil
}

func servicePort(s *model.Snapshot, name string) int {
	if svc := findService(s, name); svc != nil && len(svc.Ports) > 0 {
		return int(svc.Ports[0].Port)
	}
	return 0
}

func hasProblem(s *model.Snapshot, object, field string) bool {
	for _, p := range s.Problems {
		if strings.Contains(p.Object, object) && p.Field == field {
			return true
		}
	}
	return false
}

func TestSourceChanges(t *testing.T) {
	web80 := join(svcYAML("web", "10.96.0.10", 80), sliceYAML("web-1", "web", "10.0.0.1"))
	tests := []struct {
		name    string
		files   map[string]string
		initial func(*model.Snapshot) bool
		change  func(t *testing.T, dir string)
		want    func(*model.Snapshot) bool
		// never, if set, must not hold for any snapshot after the initial one.
		never func(*model.Snapshot) bool
	}{
		{
			name:    "add a file",
			initial: func(s *model.Snapshot) bool { return len(s.Services) == 0 && len(s.Problems) == 0 },
			change:  func(t *testing.T, dir string) { write(t, dir, "web.yaml", web80) },
			want: func(s *model.Snapshot) bool {
				return servicePort(s, "web") == 80 && len(s.Slices) == 1 && s.Slices[0].Service.Name == "web" && len(s.Problems) == 0
			},
		},
		{
			name:    "change a file",
			files:   map[string]string{"web.yaml": web80},
			initial: func(s *model.Snapshot) bool { return servicePort(s, "web") == 80 },
			change:  func(t *testing.T, dir string) { write(t, dir, "web.yaml", svcYAML("web", "10.96.0.10", 81)) },
			want:    func(s *model.Snapshot) bool { return servicePort(s, "web") == 81 && len(s.Slices) == 0 },
		},
		{
			name:    "delete a file",
			files:   map[string]string{"web.yaml": web80, "db.yml": svcYAML("db", "10.96.0.11", 5432)},
			initial: func(s *model.Snapshot) bool { return len(s.Services) == 2 },
			change: func(t *testing.T, dir string) {
				if err := os.Remove(filepath.Join(dir, "web.yaml")); err != nil {
					t.Fatal(err)
				}
			},
			want: func(s *model.Snapshot) bool {
				return len(s.Services) == 1 && servicePort(s, "db") == 5432 && len(s.Slices) == 0
			},
		},
		{
			name:    "rename a file keeps its objects without a gap",
			files:   map[string]string{"web.yaml": web80},
			initial: func(s *model.Snapshot) bool { return servicePort(s, "web") == 80 },
			change: func(t *testing.T, dir string) {
				if err := os.Rename(filepath.Join(dir, "web.yaml"), filepath.Join(dir, "frontend.yaml")); err != nil {
					t.Fatal(err)
				}
				// A later edit under the new name must be seen.
				time.Sleep(100 * time.Millisecond)
				write(t, dir, "frontend.yaml", join(svcYAML("web", "10.96.0.10", 82), sliceYAML("web-1", "web", "10.0.0.1")))
			},
			want:  func(s *model.Snapshot) bool { return servicePort(s, "web") == 82 && len(s.Slices) == 1 },
			never: func(s *model.Snapshot) bool { return findService(s, "web") == nil },
		},
		{
			name:    "editor writes a temp file and renames it into place",
			files:   map[string]string{"web.yaml": web80},
			initial: func(s *model.Snapshot) bool { return servicePort(s, "web") == 80 },
			change: func(t *testing.T, dir string) {
				write(t, dir, ".web.yaml.swp", "garbage: [")
				write(t, dir, "web.yaml.tmp", svcYAML("web", "10.96.0.10", 8080))
				if err := os.Rename(filepath.Join(dir, "web.yaml.tmp"), filepath.Join(dir, "web.yaml")); err != nil {
					t.Fatal(err)
				}
			},
			want:  func(s *model.Snapshot) bool { return servicePort(s, "web") == 8080 && len(s.Problems) == 0 },
			never: func(s *model.Snapshot) bool { return findService(s, "web") == nil },
		},
		{
			name:    "malformed YAML keeps the last good state",
			files:   map[string]string{"web.yaml": web80},
			initial: func(s *model.Snapshot) bool { return servicePort(s, "web") == 80 },
			change: func(t *testing.T, dir string) {
				write(t, dir, "web.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: web\n---\n"+sliceYAML("web-1", "web", "10.0.0.1"))
			},
			want: func(s *model.Snapshot) bool {
				return servicePort(s, "web") == 80 && len(s.Slices) == 1 &&
					hasProblem(s, "file web.yaml document 1", "") &&
					hasProblem(s, "file web.yaml document 1 (Service default/web)", "")
			},
			never: func(s *model.Snapshot) bool { return findService(s, "web") == nil },
		},
		{
			name:    "unknown field keeps the last good state and names the field",
			files:   map[string]string{"web.yaml": web80},
			initial: func(s *model.Snapshot) bool { return servicePort(s, "web") == 80 },
			change: func(t *testing.T, dir string) {
				write(t, dir, "web.yaml", join(sliceYAML("web-1", "web", "10.0.0.1"),
					strings.Replace(svcYAML("web", "10.96.0.10", 81), "    port: 81", "    port: 81\n    prot: TCP", 1)))
			},
			want: func(s *model.Snapshot) bool {
				return servicePort(s, "web") == 80 && hasProblem(s, "file web.yaml document 2 (Service default/web)", "spec.ports[0].prot")
			},
			never: func(s *model.Snapshot) bool { return findService(s, "web") == nil },
		},
		{
			name:    "invalid value keeps the last good state and names the field",
			files:   map[string]string{"web.yaml": web80},
			initial: func(s *model.Snapshot) bool { return servicePort(s, "web") == 80 },
			change:  func(t *testing.T, dir string) { write(t, dir, "web.yaml", svcYAML("web", "10.96.0.10", 70000)) },
			want: func(s *model.Snapshot) bool {
				return servicePort(s, "web") == 80 && len(s.Slices) == 0 &&
					hasProblem(s, "file web.yaml document 1 (Service default/web)", "spec.ports[0].port")
			},
		},
		{
			name:    "EndpointSlice address typo keeps the slice's last good version",
			files:   map[string]string{"web.yaml": join(svcYAML("web", "10.96.0.10", 80), sliceYAML("web-1", "web", "10.240.1.30"))},
			initial: func(s *model.Snapshot) bool { return len(s.Slices) == 1 },
			change: func(t *testing.T, dir string) {
				write(t, dir, "web.yaml", join(svcYAML("web", "10.96.0.10", 80), sliceYAML("web-1", "web", "10.240.1.300")))
			},
			want: func(s *model.Snapshot) bool {
				return len(s.Slices) == 1 && len(s.Slices[0].Endpoints) == 1 &&
					s.Slices[0].Endpoints[0].Address == netip.MustParseAddr("10.240.1.30") &&
					hasProblem(s, "file web.yaml document 2 (EndpointSlice default/web-1)", "endpoints[0].addresses[0]")
			},
			never: func(s *model.Snapshot) bool { return len(s.Slices) == 0 },
		},
		{
			name:  "leading-zero addresses are refused by field",
			files: map[string]string{"web.yaml": join(svcYAML("web", "010.096.000.060", 80), svcYAML("db", "10.96.0.61", 80))},
			initial: func(s *model.Snapshot) bool {
				return len(s.Services) == 1 && findService(s, "db") != nil &&
					hasProblem(s, "file web.yaml document 1 (Service default/web)", "spec.clusterIP")
			},
		},
		{
			name:  "fixing a broken file clears its problems",
			files: map[string]string{"web.yaml": "kind: [", "db.yaml": svcYAML("db", "10.96.0.11", 5432)},
			initial: func(s *model.Snapshot) bool {
				return len(s.Services) == 1 && hasProblem(s, "file web.yaml document 1", "")
			},
			change: func(t *testing.T, dir string) { write(t, dir, "web.yaml", web80) },
			want:   func(s *model.Snapshot) bool { return len(s.Services) == 2 && len(s.Problems) == 0 },
		},
		{
			name: "invalid Service skipped, others in the same file stay",
			files: map[string]string{"all.yaml": join(svcYAML("a", "10.96.0.1", 80), svcYAML("bad", "10.96.0.300", 80),
				svcYAML("c", "10.96.0.3", 80))},
			initial: func(s *model.Snapshot) bool {
				return len(s.Services) == 2 && servicePort(s, "a") == 80 && servicePort(s, "c") == 80 &&
					hasProblem(s, "file all.yaml document 2 (Service default/bad)", "spec.clusterIP")
			},
		},
		{
			name:  "duplicate object across files: first file by name wins",
			files: map[string]string{"b.yaml": svcYAML("web", "10.96.0.10", 82), "a.yaml": svcYAML("web", "10.96.0.10", 81)},
			initial: func(s *model.Snapshot) bool {
				return len(s.Services) == 1 && servicePort(s, "web") == 81 && hasProblem(s, "file b.yaml document 1 (Service default/web)", "metadata.name")
			},
			change: func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "a.yaml")) },
			want:   func(s *model.Snapshot) bool { return servicePort(s, "web") == 82 && len(s.Problems) == 0 },
		},
		{
			name: "Node document for this node is picked up",
			files: map[string]string{"nodes.yaml": join(
				"apiVersion: v1\nkind: Node\nmetadata:\n  name: other\n  labels: {topology.kubernetes.io/zone: z9}\n",
				"apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n  labels: {topology.kubernetes.io/zone: z1}\n")},
			initial: func(s *model.Snapshot) bool { return s.Node != nil && s.Node.Name == "n1" && s.Node.Zone() == "z1" },
			change: func(t *testing.T, dir string) {
				write(t, dir, "nodes.yaml", "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n  labels: {topology.kubernetes.io/zone: z2}\nspec:\n  taints: [{key: ToBeDeletedByClusterAutoscaler, effect: NoSchedule}]\n")
			},
			want: func(s *model.Snapshot) bool { return s.Node != nil && s.Node.Zone() == "z2" && s.Node.ToBeDeleted },
		},
		{
			name:    "directory removed and recreated",
			files:   map[string]string{"web.yaml": web80},
			initial: func(s *model.Snapshot) bool { return servicePort(s, "web") == 80 },
			change: func(t *testing.T, dir string) {
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
				time.Sleep(300 * time.Millisecond)
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				write(t, dir, "db.yaml", svcYAML("db", "10.96.0.11", 5432))
			},
			want: func(s *model.Snapshot) bool {
				return len(s.Services) == 1 && servicePort(s, "db") == 5432 && len(s.Problems) == 0
			},
			// While the directory is gone the last state stays in force.
			never: func(s *model.Snapshot) bool { return len(s.Services) == 0 },
		},
		{
			name:  "Service without clusterIP and no allocator is refused",
			files: map[string]string{"web.yaml": join(svcYAML("web", "", 80), svcYAML("db", "10.96.0.11", 5432))},
			initial: func(s *model.Snapshot) bool {
				return len(s.Services) == 1 && hasProblem(s, "(Service default/web)", "spec.clusterIP")
			},
		},
		{
			name: "v1 List items are read",
			files: map[string]string{"list.json": `{"apiVersion":"v1","kind":"List","items":[
				{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","namespace":"x"},"spec":{"clusterIP":"10.96.0.1","ports":[{"port":1}]}},
				{"apiVersion":"v1","kind":"Service","metadata":{"name":"b"},"spec":{"clusterIP":"10.96.0.2","ports":[{"port":2,"protocol":"SCTPP"}]}}]}`},
			initial: func(s *model.Snapshot) bool {
				return len(s.Services) == 1 && s.Services[0].Namespace == "x" &&
					hasProblem(s, "file list.json document 1 items[1] (Service default/b)", "spec.ports[0].protocol")
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, Options{NodeName: "n1"}, tc.files)
			if !tc.initial(h.last) {
				t.Fatalf("initial snapshot: %s", describe(h.last))
			}
			if tc.change == nil {
				return
			}
			tc.change(t, h.dir)
			h.until("the change", tc.want, func(s *model.Snapshot) {
				if tc.never != nil && tc.never(s) {
					t.Errorf("unwanted intermediate snapshot: %s", describe(s))
				}
			})
		})
	}
}

func TestSourceNoIdenticalSnapshots(t *testing.T) {
	h := start(t, Options{Rescan: 50 * time.Millisecond}, map[string]string{"web.yaml": svcYAML("web", "10.96.0.10", 80)})
	// Rewriting the same bytes, touching a file, adding an ignored file and
	// periodic rescans change nothing a dataplane sees.
	write(t, h.dir, "web.yaml", svcYAML("web", "10.96.0.10", 80))
	now := time.Now().Add(time.Second)
	os.Chtimes(filepath.Join(h.dir, "web.yaml"), now, now)
	write(t, h.dir, "README.md", "not a manifest")
	h.quiet(400 * time.Millisecond)
	write(t, h.dir, "web.yaml", svcYAML("web", "10.96.0.10", 81))
	h.until("the change", func(s *model.Snapshot) bool { return servicePort(s, "web") == 81 }, nil)
}

func TestSourceDebounce(t *testing.T) {
	// A generous quiet time so a loaded machine cannot split the burst.
	h := start(t, Options{Debounce: 500 * time.Millisecond}, nil)
	for i := range 20 {
		write(t, h.dir, fmt.Sprintf("s%02d.yaml", i), svcYAML(fmt.Sprintf("s%02d", i), fmt.Sprintf("10.96.0.%d", i+1), 80))
	}
	count := 0
	h.until("all 20 Services", func(s *model.Snapshot) bool { return len(s.Services) == 20 }, func(*model.Snapshot) { count++ })
	if count > 3 {
		t.Errorf("a burst of 20 writes produced %d snapshots, want at most 3", count)
	}
}

func TestSourceMissingDir(t *testing.T) {
	err := New(Options{Dir: filepath.Join(t.TempDir(), "nope")}).Run(context.Background(), make(chan *model.Snapshot))
	if !os.IsNotExist(err) && !strings.Contains(fmt.Sprint(err), "no such file") {
		t.Fatalf("Run on a missing directory: %v, want a not-exist error", err)
	}
}

// countingHandler counts log records whose message is "manifest problem".
type countingHandler struct {
	mu sync.Mutex
	n  map[string]int // by object+field
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *countingHandler) WithGroup(string) slog.Handler            { return h }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "manifest problem" {
		return nil
	}
	key := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "object" || a.Key == "field" {
			key += a.Value.String() + "|"
		}
		return true
	})
	h.mu.Lock()
	h.n[key]++
	h.mu.Unlock()
	return nil
}

// TestSourceLeavesProblemLogsToTheLoop: the source logs no problem line
// of its own (the reconcile loop logs each once, bounded per file) and
// tags every problem found in a file with that file, also for a file of
// 100,000 empty objects.
func TestSourceLeavesProblemLogsToTheLoop(t *testing.T) {
	ch := &countingHandler{n: map[string]int{}}
	h := start(t, Options{Rescan: 20 * time.Millisecond, Logger: slog.New(ch)}, map[string]string{
		"a.yaml":   svcYAML("web", "10.96.0.10", 70000),
		"b.yaml":   svcYAML("db", "10.96.0.11", 5432),
		"c.yaml":   svcYAML("db", "10.96.0.11", 5433), // duplicate of b.yaml
		"big.yaml": strings.Repeat("---\n{}\n", 100000),
	})
	if !hasProblem(h.last, "file a.yaml document 1 (Service default/web)", "spec.ports[0].port") ||
		!hasProblem(h.last, "file c.yaml document 1 (Service default/db)", "metadata.name") {
		t.Fatalf("initial problems: %s", describe(h.last))
	}
	perFile := map[string]int{}
	for _, p := range h.last.Problems {
		if p.File == "" || !strings.HasPrefix(p.Object, "file "+p.File+" ") {
			t.Fatalf("problem %q has File %q", p.Error(), p.File)
		}
		perFile[p.File]++
	}
	if perFile["big.yaml"] != 100000 {
		t.Errorf("big.yaml: %d problems, want 100000 (one per document)", perFile["big.yaml"])
	}
	time.Sleep(100 * time.Millisecond) // a few periodic rescans
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if len(ch.n) != 0 {
		t.Errorf("the source logged problems itself: %v", ch.n)
	}
}

// TestForcedRescan: the periodic rescan re-reads every file: one whose
// content changed under the same size and mtime (no event seen) is
// decoded again, the others are only hashed (their decoded objects stay
// the same pointers).
func TestForcedRescan(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", svcYAML("a", "10.96.0.10", 80))
	write(t, dir, "b.yaml", svcYAML("b", "10.96.0.11", 80))
	s := New(Options{Dir: dir})
	ctx := context.Background()
	s.rescan(ctx, true)
	b0 := s.files["b.yaml"].good[0].svc
	path := filepath.Join(dir, "a.yaml")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	write(t, dir, "a.yaml", svcYAML("a", "10.96.0.10", 81)) // same length
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if fi2, _ := os.Stat(path); fi2.Size() != fi.Size() || !fi2.ModTime().Equal(fi.ModTime()) {
		t.Fatal("the rewrite changed size or mtime")
	}
	if snap := s.rescan(ctx, false); servicePort(snap, "a") != 80 {
		t.Fatalf("a rescan by size and mtime saw the change: port %d", servicePort(snap, "a"))
	}
	snap := s.rescan(ctx, true)
	if servicePort(snap, "a") != 81 {
		t.Errorf("the forced rescan missed a change under the same size and mtime: port %d", servicePort(snap, "a"))
	}
	if s.files["b.yaml"].good[0].svc != b0 {
		t.Error("the forced rescan decoded an unchanged file again")
	}
}

// TestPeriodicCheck: a file replaced by one of the same size and mtime
// (renamed into place: the watch's rescan sees nothing by size and mtime)
// is found by the periodic check, which hashes every file beside the loop;
// verify names exactly the changed files.
func TestPeriodicCheck(t *testing.T) {
	h := start(t, Options{Rescan: 100 * time.Millisecond}, map[string]string{
		"a.yaml": svcYAML("a", "10.96.0.10", 80), "b.yaml": svcYAML("b", "10.96.0.11", 80)})
	path := filepath.Join(h.dir, "a.yaml")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(t.TempDir(), "a.yaml")
	if err := os.WriteFile(tmp, []byte(svcYAML("a", "10.96.0.10", 81)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	h.until("the change under the same size and mtime", func(s *model.Snapshot) bool { return servicePort(s, "a") == 81 }, nil)

	dir := t.TempDir()
	write(t, dir, "a.yaml", svcYAML("a", "10.96.0.10", 80))
	write(t, dir, "b.yaml", svcYAML("b", "10.96.0.11", 80))
	s := New(Options{Dir: dir})
	s.rescan(context.Background(), true)
	if stale := verify(dir, s.sums()); len(stale) != 0 {
		t.Errorf("verify of unchanged files = %v", stale)
	}
	write(t, dir, "b.yaml", svcYAML("b", "10.96.0.11", 81))
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	if stale := verify(dir, s.sums()); !slices.Equal(slices.Sorted(slices.Values(stale)), []string{"a.yaml", "b.yaml"}) {
		t.Errorf("verify after a change and a removal = %v, want both", stale)
	}
}

// BenchmarkForcedRescan10000: the periodic rescan of an unchanged
// 10,000-Service directory (every file hashed, none decoded).
func BenchmarkForcedRescan10000(b *testing.B) {
	dir := writeBenchDir(b, 100, 100)
	s := New(Options{Dir: dir})
	s.rescan(context.Background(), true)
	b.ReportAllocs()
	for b.Loop() {
		if snap := s.rescan(context.Background(), true); len(snap.Services) != 10000 {
			b.Fatalf("%d services", len(snap.Services))
		}
	}
}
