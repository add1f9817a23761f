package allocator

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

// faultMap fills a bbolt map at path with n assigned Services (half of
// them NodePorts), closes it, and returns what each got.
func faultMap(t *testing.T, path string, n int) map[model.ServiceName]Record {
	t.Helper()
	store, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAssigner(AssignerOptions{Store: store, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.100.0.0/16")}, StaticSubrange: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		svc := model.Service{ServiceName: model.ServiceName{Namespace: "ns", Name: "s" + strconv.Itoa(i)}, Type: model.TypeClusterIP,
			Ports: []model.ServicePortSpec{{Name: "p", Protocol: model.TCP, Port: 80}}}
		if i%2 == 0 {
			svc.Type = model.TypeNodePort
		}
		if _, err := a.Assign(context.Background(), svc); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	return records(t, path)
}

// records opens path and returns its records; the test fails if it cannot.
func records(t *testing.T, path string) map[model.ServiceName]Record {
	t.Helper()
	store, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	m, err := store.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[model.ServiceName]Record{}
	m.Range(func(n model.ServiceName, r Record) bool { out[n] = r; return true })
	return out
}

func sameRecords(a, b map[model.ServiceName]Record) bool {
	if len(a) != len(b) {
		return false
	}
	for n, r := range a {
		if o, ok := b[n]; !ok || !r.equal(o) {
			return false
		}
	}
	return true
}

// TestBoltFaults damages the map between runs. The next start either
// refuses with the matching error and a recovery procedure that, followed,
// gives back exactly the allocations handed out, or opens the map with
// exactly those allocations. No fault hands out a different address.
func TestBoltFaults(t *testing.T) {
	pageSize := os.Getpagesize()
	tests := []struct {
		name   string
		damage func(t *testing.T, path string)
		want   error // nil: refusing or opening unchanged are both right
	}{
		{name: "truncated to 0 bytes", want: ErrMapEmpty, damage: func(t *testing.T, path string) {
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "truncated to half", damage: func(t *testing.T, path string) {
			fi, _ := os.Stat(path)
			if err := os.Truncate(path, fi.Size()/2); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "truncated to 3 pages", want: ErrMapCorrupt, damage: func(t *testing.T, path string) {
			if err := os.Truncate(path, int64(3*pageSize)); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "garbage in the data pages", want: ErrMapCorrupt, damage: func(t *testing.T, path string) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			for i := 2 * pageSize; i < len(data); i++ {
				data[i] = byte(r.Uint32())
			}
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "garbage in the meta pages", want: ErrMapCorrupt, damage: func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			junk := make([]byte, 2*pageSize)
			for i := range junk {
				junk[i] = 0x5a
			}
			if _, err := f.WriteAt(junk, 0); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "deleted", want: ErrMapMissing, damage: func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), DefaultStateFile)
			want := faultMap(t, path, 200)
			tc.damage(t, path)
			store, err := OpenBolt(path)
			if err == nil {
				store.Close()
				if tc.want != nil {
					t.Fatalf("damaged map opened, want %v", tc.want)
				}
				if got := records(t, path); !sameRecords(got, want) {
					t.Fatalf("damaged map opened with other allocations")
				}
				return
			}
			t.Logf("refused: %v", err)
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), "mv "+path+LastGoodSuffix+" "+path) {
				t.Fatalf("error does not give the restore command: %v", err)
			}
			// Refused again on the next start: nothing was rewritten.
			if _, err2 := OpenBolt(path); err2 == nil {
				t.Fatalf("second start opened the damaged map")
			}
			// Follow the procedure.
			if err := os.Rename(path+LastGoodSuffix, path); err != nil {
				t.Fatal(err)
			}
			if got := records(t, path); !sameRecords(got, want) {
				t.Fatalf("restored map differs: %d records, want %d", len(got), len(want))
			}
		})
	}
}

// TestBoltFirstStart: no map and no last good copy is a first start; the
// copy appears beside the new map, and after a Close it holds every commit.
func TestBoltFirstStart(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, DefaultStateFile)
	want := faultMap(t, path, 10)
	if len(want) != 10 {
		t.Fatalf("%d records", len(want))
	}
	if err := os.Rename(path+LastGoodSuffix, path); err != nil {
		t.Fatal(err)
	}
	if got := records(t, path); !sameRecords(got, want) {
		t.Fatalf("last good copy after Close lacks commits: %d records", len(got))
	}
	// Both removed: the operator's explicit fresh start.
	os.Remove(path)
	os.Remove(path + LastGoodSuffix)
	if got := records(t, path); len(got) != 0 {
		t.Fatalf("fresh start has %d records", len(got))
	}
}

// FuzzOpenBolt: whatever bytes the map file holds, OpenBolt returns a
// store or an error, and never panics.
func FuzzOpenBolt(f *testing.F) {
	dir := f.TempDir()
	good := filepath.Join(dir, "seed.db")
	s, err := OpenBolt(good)
	if err != nil {
		f.Fatal(err)
	}
	_ = s.Update(context.Background(), func(m *Map) error {
		m.Set(model.ServiceName{Namespace: "ns", Name: "a"}, Record{ClusterIPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
		return nil
	})
	s.Close()
	seed, err := os.ReadFile(good)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)/2])
	f.Add([]byte{})
	f.Add([]byte("not a database"))
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "allocations.db")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if s, err := OpenBolt(path); err == nil {
			s.Close()
		}
	})
}
