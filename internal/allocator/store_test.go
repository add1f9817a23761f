package allocator

import (
	"context"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

func TestOpenStore(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "state")
	s, err := OpenStore(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*BoltStore); !ok {
		t.Fatalf("\"\" opened %T, want *BoltStore", s)
	}
	if _, err := os.Stat(filepath.Join(dir, DefaultStateFile)); err != nil {
		t.Fatalf("state file: %v", err)
	}
	s.Close()
	for _, tc := range []struct{ registry, stateDir, wantErr string }{
		{"", "", "--state-dir is required"},
		{"consul://x:1", "/tmp", "want \"\" (bbolt in the state dir) or etcd://"},
		{"etcd://", "", "bad endpoint"},
		{"etcd://a:1,,b:2", "", "bad endpoint"},
		{"etcd://a:1/path", "", "bad endpoint"},
	} {
		t.Run(tc.registry, func(t *testing.T) {
			_, err := OpenStore(ctx, tc.registry, tc.stateDir)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("OpenStore(%q, %q) = %v, want an error containing %q", tc.registry, tc.stateDir, err, tc.wantErr)
			}
		})
	}
	// An unreachable etcd fails when ctx ends instead of hanging.
	tctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	if _, err := OpenStore(tctx, "etcd://127.0.0.1:1", ""); err == nil {
		t.Fatal("OpenStore of an unreachable etcd succeeded")
	}
}

// TestBoltUpdateAbort: an fn error leaves the map and revision unchanged.
func TestBoltUpdateAbort(t *testing.T) {
	ctx := context.Background()
	s := openBoltT(t, filepath.Join(t.TempDir(), "a.db"))
	n := svcName("a", "b")
	if err := s.Update(ctx, func(m *Map) error {
		m.Set(n, Record{ClusterIPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	boom := context.Canceled
	if err := s.Update(ctx, func(m *Map) error {
		m.Delete(n)
		m.Set(svcName("a", "c"), Record{HealthCheckNodePort: 30001})
		return boom
	}); err != boom {
		t.Fatalf("Update returned %v, want fn's error", err)
	}
	m, _ := s.Snapshot(ctx)
	if m.Revision() != 1 || m.Len() != 1 {
		t.Fatalf("after an aborted update: revision %d, %d records", m.Revision(), m.Len())
	}
	if _, ok := m.Get(n); !ok {
		t.Fatal("aborted delete was applied")
	}
	// A no-op update writes nothing.
	if err := s.Update(ctx, func(m *Map) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if m, _ := s.Snapshot(ctx); m.Revision() != 1 {
		t.Fatalf("no-op update bumped the revision to %d", m.Revision())
	}
}

// TestEtcdHostsSeeEachOther: what one host assigns or releases, another
// host's store reflects (through its watch), and a fresh OpenStore with an
// etcd:// registry reads it back.
func TestEtcdHostsSeeEachOther(t *testing.T) {
	te := startTestEtcd(t)
	ctx := context.Background()
	hostA := newAssignerT(t, openEtcdT(t, te, ""), v4CIDR)
	storeB := openEtcdT(t, te, "")
	hostB := newAssignerT(t, storeB, v4CIDR)

	web, err := hostA.Assign(ctx, clusterIPSvc("default", "web"))
	if err != nil {
		t.Fatal(err)
	}
	// Host B refuses the IP (its CAS sees A's commit) and names the owner.
	if _, err := hostB.Assign(ctx, clusterIPSvc("default", "other", web.ClusterIPs[0].String())); err == nil ||
		!strings.Contains(err.Error(), "already allocated to default/web") {
		t.Fatalf("host B took host A's IP: %v", err)
	}
	// Host B's snapshot catches up through the watch.
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, _ := storeB.Snapshot(ctx)
		if r, ok := m.Get(web.ServiceName); ok && r.ClusterIPs[0] == web.ClusterIPs[0] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("host B never saw host A's assignment")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := hostA.Release(ctx, web.ServiceName); err != nil {
		t.Fatal(err)
	}
	if _, err := hostB.Assign(ctx, clusterIPSvc("default", "other", web.ClusterIPs[0].String())); err != nil {
		t.Fatalf("after host A released it, host B cannot take the IP: %v", err)
	}
	fresh, err := OpenStore(ctx, "etcd://"+te.clientAddr, "")
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	m, _ := fresh.Snapshot(ctx)
	if names := m.Names(); len(names) != 1 || names[0] != svcName("default", "other") {
		t.Fatalf("fresh store reads %v", names)
	}
}

func TestRunRepair(t *testing.T) {
	store := openBoltT(t, filepath.Join(t.TempDir(), "a.db"))
	writer := newAssignerT(t, store)
	rep, err := NewAssigner(AssignerOptions{Store: store, ServiceCIDRs: []netip.Prefix{v4CIDR}, LeakThreshold: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := writer.Assign(ctx, clusterIPSvc("default", "gone")); err != nil {
		t.Fatal(err)
	}
	var passes atomic.Int32
	errc := make(chan error, 1)
	go func() {
		errc <- rep.RunRepair(ctx, 20*time.Millisecond, func(context.Context) ([]model.ServiceName, error) {
			passes.Add(1)
			return nil, nil
		})
	}()
	for {
		m, _ := store.Snapshot(ctx)
		if m.Len() == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("RunRepair never released the leak")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if p := passes.Load(); p < 2 {
		t.Fatalf("released after %d passes, want >= 2", p)
	}
	cancel()
	if err := <-errc; err != context.Canceled && err != context.DeadlineExceeded {
		t.Fatalf("RunRepair returned %v", err)
	}
}

// TestEtcdWatchLagAndCompaction: a host whose watch fell behind still
// updates correctly (the CAS fails, it reloads after a second), and one
// whose watch resumes past an etcd compaction reloads the whole map.
func TestEtcdWatchLagAndCompaction(t *testing.T) {
	te := startTestEtcd(t)
	ctx := context.Background()
	hostA := newAssignerT(t, openEtcdT(t, te, ""), v4CIDR)
	storeB := openEtcdT(t, te, "")
	hostB := newAssignerT(t, storeB, v4CIDR)

	// B has seen web, then its watch freezes and A releases web: B's copy
	// still says web holds the IP, but that stale verdict must not stand.
	web, err := hostA.Assign(ctx, clusterIPSvc("a", "web"))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		m, _ := storeB.Snapshot(ctx)
		if _, ok := m.Get(web.ServiceName); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("B never saw web")
		}
		time.Sleep(5 * time.Millisecond)
	}
	storeB.stop()
	<-storeB.done
	if err := hostA.Release(ctx, web.ServiceName); err != nil {
		t.Fatal(err)
	}
	if _, err := hostB.Assign(ctx, clusterIPSvc("b", "taker", web.ClusterIPs[0].String())); err != nil {
		t.Fatalf("B refused a released IP from its stale copy: %v", err)
	}
	if err := hostB.Release(ctx, svcName("b", "taker")); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := hostA.Assign(ctx, clusterIPSvc("a", "s"+string(rune('0'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	// B's copy is stale, yet its CAS cannot succeed on it: it reloads.
	got, err := hostB.Assign(ctx, clusterIPSvc("b", "one"))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := storeB.Snapshot(ctx)
	if m.Len() != 6 {
		t.Fatalf("B sees %d records after its update, want 6", m.Len())
	}
	m.Range(func(n model.ServiceName, r Record) bool {
		if n.Namespace == "a" && r.ClusterIPs[0] == got.ClusterIPs[0] {
			t.Errorf("B gave %v to b/one while %v holds it", got.ClusterIPs[0], n)
		}
		return true
	})

	// Compact etcd past B's watch position, then restart B's watch there.
	for i := range 3 {
		if _, err := hostA.Assign(ctx, clusterIPSvc("a", "late"+string(rune('0'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := storeB.cli.Get(ctx, "compaction-probe")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := storeB.cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	storeB.mu.Lock()
	storeB.watchFrom = 2 // long compacted
	storeB.mu.Unlock()
	wctx, cancel := context.WithCancel(context.Background())
	storeB.stop, storeB.done = cancel, make(chan struct{})
	go storeB.watch(wctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, _ := storeB.Snapshot(ctx)
		if _, ok := m.Get(svcName("a", "late2")); ok && m.Len() == 9 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("B never reloaded after the compaction: %v", m.Names())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSnapshotStaysPut: a snapshot keeps the records it was taken with
// while the store's map changes after it (an Update in bbolt; on etcd, an
// Update and another host's commit arriving through the watch), and the
// store sees every change. A snapshot of an unchanged map copies nothing.
func TestSnapshotStaysPut(t *testing.T) {
	ctx := context.Background()
	ip := func(s string) []netip.Addr { return []netip.Addr{netip.MustParseAddr(s)} }
	a, b, c := svcName("ns", "a"), svcName("ns", "b"), svcName("ns", "c")
	te := startTestEtcd(t)
	for _, tc := range []struct {
		name  string
		store Store
		other Store // another host's store on the same map, or nil
	}{
		{"bolt", openBoltT(t, filepath.Join(t.TempDir(), "a.db")), nil},
		{"etcd", openEtcdT(t, te, "/snap/"), openEtcdT(t, te, "/snap/")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.store.Update(ctx, func(m *Map) error {
				m.Set(a, Record{ClusterIPs: ip("10.0.0.1")})
				m.Set(b, Record{ClusterIPs: ip("10.0.0.2")})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if n := testing.AllocsPerRun(10, func() { tc.store.Snapshot(ctx) }); n > 3 {
				t.Errorf("a snapshot of an unchanged map made %v allocations", n)
			}
			before, _ := tc.store.Snapshot(ctx)
			want := map[model.ServiceName]string{b: "10.0.0.3"}
			if tc.other != nil {
				// First a change that reaches this store through its
				// watch alone.
				if err := tc.other.Update(ctx, func(m *Map) error {
					m.Set(c, Record{ClusterIPs: ip("10.0.0.4")})
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				want[c] = "10.0.0.4"
				for deadline := time.Now().Add(10 * time.Second); ; {
					if m, _ := tc.store.Snapshot(ctx); m.Len() == 3 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("the other host's commit never arrived")
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			if err := tc.store.Update(ctx, func(m *Map) error {
				m.Delete(a)
				m.Set(b, Record{ClusterIPs: ip("10.0.0.3")})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			records := func(m *Map) map[model.ServiceName]string {
				out := map[model.ServiceName]string{}
				m.Range(func(n model.ServiceName, r Record) bool {
					out[n] = r.ClusterIPs[0].String()
					return true
				})
				return out
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				now, _ := tc.store.Snapshot(ctx)
				got := records(now)
				if maps.Equal(got, want) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("store reads %v, want %v", got, want)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got, old := records(before), (map[model.ServiceName]string{a: "10.0.0.1", b: "10.0.0.2"}); !maps.Equal(got, old) {
				t.Errorf("the snapshot taken before the changes reads %v, want %v", got, old)
			}
		})
	}
}
