package manifests

import (
	"context"
	"crypto/sha256"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

// roundTrip encodes entries as the cache does and decodes them back.
func roundTrip(t *testing.T, entries []entry) []entry {
	t.Helper()
	r := &reader{b: appendEntries(nil, entries)}
	out := r.entries()
	if r.err != nil || len(r.b) != 0 {
		t.Fatalf("decoding what was encoded: %v, %d bytes left", r.err, len(r.b))
	}
	return out
}

// TestCacheRoundTripFiles: the decode of every example manifest and fuzz
// seed (broken documents and their problems included) reads back from
// the cache's encoding exactly as it was.
func TestCacheRoundTripFiles(t *testing.T) {
	for _, p := range exampleFiles(t) {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		in := decodeFile("f.yaml", data, "n1")
		if got := roundTrip(t, in); !reflect.DeepEqual(got, in) {
			t.Errorf("%s: read back\n%s\nwant\n%s", p, summary(got), summary(in))
		}
	}
}

// fillAll sets every field reachable from v (a pointer) to a non-zero
// value, so that a codec that misses a field, today's or one added
// later, fails a round trip. Locs get hints of both kinds.
func fillAll(t *testing.T, v reflect.Value, seed *int) {
	*seed++
	n := *seed
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		fillAll(t, v.Elem(), seed)
	case reflect.Struct:
		switch v.Type() {
		case reflect.TypeFor[netip.Addr]():
			v.Set(reflect.ValueOf(netip.AddrFrom4([4]byte{10, 0, byte(n >> 8), byte(n)})))
			return
		case reflect.TypeFor[netip.Prefix]():
			v.Set(reflect.ValueOf(netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 15: byte(n)}), 64)))
			return
		case reflect.TypeFor[model.Loc]():
			v.Set(reflect.ValueOf(model.At("node", "zone").WithHints([]string{"z1", "z2"}, []string{"n1"})))
			return
		}
		for i := range v.NumField() {
			if !v.Type().Field(i).IsExported() {
				t.Fatalf("%s.%s is unexported: teach fillAll", v.Type(), v.Type().Field(i).Name)
			}
			fillAll(t, v.Field(i), seed)
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fillAll(t, v.Index(i), seed)
		}
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fillAll(t, k, seed)
		fillAll(t, e, seed)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.String:
		v.SetString("s" + string(rune('a'+n%26)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(n % 200))
	default:
		t.Fatalf("fillAll: %s", v.Type())
	}
}

// TestCacheRoundTripEveryField: objects with every field set, and with
// nil and empty slices and maps, read back exactly.
func TestCacheRoundTripEveryField(t *testing.T) {
	seed := 0
	var svc model.Service
	var sl model.EndpointSlice
	var node model.Node
	var probs []model.Problem
	for _, v := range []any{&svc, &sl, &node, &probs} {
		fillAll(t, reflect.ValueOf(v), &seed)
	}
	// Locs that differ from the one before in one part only (the decoder
	// reuses the last one), and the ready, serving and terminating flags,
	// which share a byte, each alone.
	sl.Endpoints = append(sl.Endpoints,
		model.SliceEndpoint{Loc: model.At("node", "zone")}, model.SliceEndpoint{Loc: model.At("node", "zone2")},
		model.SliceEndpoint{Loc: model.At("node", "zone2").WithHints([]string{"z1"}, nil)},
		model.SliceEndpoint{Loc: model.At("node", "zone2").WithHints([]string{"z1"}, []string{"n1"})},
		model.SliceEndpoint{Ready: true}, model.SliceEndpoint{Serving: true}, model.SliceEndpoint{Terminating: true, Weight: 255})
	full := []entry{
		{where: place{1, -1}, key: objKey{"Service", "ns", "a"}, svc: &svc, problems: probs},
		{where: place{2, 3}, key: objKey{"EndpointSlice", "ns", "a-1"}, slice: &sl},
		{where: place{4, -1}, key: objKey{"Node", "", "n1"}, node: &node},
		{where: place{5, -1}, problems: probs[:1]}, // a broken document
	}
	empty := []entry{
		{svc: &model.Service{ClusterIPs: []netip.Addr{}, Ports: []model.ServicePortSpec{}}},
		{slice: &model.EndpointSlice{Endpoints: []model.SliceEndpoint{}}},
		{node: &model.Node{Labels: map[string]string{}}, problems: []model.Problem{}},
	}
	for name, in := range map[string][]entry{"every field": full, "empty, not nil": empty, "none": nil, "zero": {}} {
		if got := roundTrip(t, in); !reflect.DeepEqual(got, in) {
			t.Errorf("%s: read back\n%#v\nwant\n%#v", name, got, in)
		}
	}
}

// TestCacheCorrupt: a truncated or altered record is refused, never
// half-read, and a cache file that is not one is ignored.
func TestCacheCorrupt(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "examples", "web.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rec := appendEntries(nil, decodeFile("web.yaml", data, "n1"))
	for cut := range len(rec) {
		r := &reader{b: rec[:cut]}
		if out := r.entries(); r.err == nil && len(r.b) == 0 && reflect.DeepEqual(out, decodeFile("web.yaml", data, "n1")) {
			t.Fatalf("a record cut at %d of %d bytes read back whole", cut, len(rec))
		}
	}
	c := &cacheFile{records: map[cacheKey][]byte{{"web.yaml", sha256.Sum256(data)}: rec[:len(rec)/2]}}
	if _, ok := c.lookup("web.yaml", sha256.Sum256(data)); ok {
		t.Error("lookup used a truncated record")
	}
}

// TestCacheAcrossRuns: a Source with a cache file writes the first read's
// decode; the next Source over the same files takes every file from it
// and sends the same snapshot; a changed file is decoded again; another
// version, another node or a corrupt cache file means decoding them all.
func TestCacheAcrossRuns(t *testing.T) {
	dir, state := t.TempDir(), filepath.Join(t.TempDir(), "not-yet") // made by the first write
	files := map[string]string{
		"a.yaml": join(svcYAML("a", "10.96.0.1", 80), sliceYAML("a-1", "a", "10.1.0.1")),
		"b.yaml": join(svcYAML("b", "10.96.0.2", 81), sliceYAML("b-1", "b", "10.1.0.2")),
		"c.yaml": "kind: Service\n", // broken: a problem, cached too
	}
	for name, content := range files {
		write(t, dir, name, content)
	}
	opts := Options{Dir: dir, NodeName: "n1", CacheFile: filepath.Join(state, "manifests.cache"), CacheVersion: "v1"}
	// read is one first read, as Run does it; it writes the cache at once.
	read := func(o Options) (*model.Snapshot, int) {
		t.Helper()
		s := New(o)
		s.cache = s.loadCache()
		snap := s.rescan(context.Background(), true)
		s.cache = nil
		if s.firstRead != nil {
			if err := s.writeCache(s.firstRead); err != nil {
				t.Fatal(err)
			}
		}
		return snap, s.cacheHits
	}
	want, hits := read(opts)
	if hits != 0 {
		t.Fatalf("%d files from a cache that did not exist", hits)
	}
	same := func(name string, got *model.Snapshot, wantHits, gotHits int) {
		t.Helper()
		if gotHits != wantHits {
			t.Errorf("%s: %d files from the cache, want %d", name, gotHits, wantHits)
		}
		if !reflect.DeepEqual(got.Services, want.Services) || !reflect.DeepEqual(got.Slices, want.Slices) || !reflect.DeepEqual(got.Problems, want.Problems) {
			t.Errorf("%s: snapshot differs:\n%s\nwant\n%s", name, describe(got), describe(want))
		}
	}
	got, hits := read(opts)
	same("unchanged", got, 3, hits)

	other := opts
	other.CacheVersion = "v2"
	got, hits = read(other)
	same("another version", got, 0, hits)
	got, hits = read(other) // v2 wrote its own
	same("that version again", got, 3, hits)
	other.NodeName = "n2"
	got, hits = read(other)
	same("another node", got, 0, hits)

	if err := os.WriteFile(opts.CacheFile, []byte("vipproxy manifests cache\nrubbish"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, hits = read(opts)
	same("corrupt", got, 0, hits)

	write(t, dir, "b.yaml", join(svcYAML("b", "10.96.0.2", 82), sliceYAML("b-1", "b", "10.1.0.2")))
	got, hits = read(opts)
	if hits != 2 || servicePort(got, "b") != 82 {
		t.Errorf("after a change: %d files from the cache (want 2), port %d (want 82)", hits, servicePort(got, "b"))
	}
	if err := os.WriteFile(filepath.Join(state, cacheTemp+"123"), []byte("cut short"), 0o600); err != nil {
		t.Fatal(err)
	}
	read(opts) // writes again, removing what a write cut short left
	if entries, _ := os.ReadDir(state); len(entries) != 1 {
		t.Errorf("state directory holds %d files, want the cache alone", len(entries))
	}
}

// TestCacheWrittenAfterDelay: Run writes the cache cacheDelay after its
// first snapshot, and not when every file came from it.
func TestCacheWrittenAfterDelay(t *testing.T) {
	defer func(d time.Duration) { cacheDelay = d }(cacheDelay)
	cacheDelay = 50 * time.Millisecond
	state := t.TempDir()
	cache := filepath.Join(state, "manifests.cache")
	opts := Options{NodeName: "n1", CacheFile: cache, CacheVersion: "v1"}
	files := map[string]string{"a.yaml": join(svcYAML("a", "10.96.0.1", 80), sliceYAML("a-1", "a", "10.1.0.1"))}
	h := start(t, opts, files) // after its first snapshot
	var fi os.FileInfo
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if fi, err = os.Stat(cache); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no cache file 5 s after the first snapshot")
		}
	}
	s := New(Options{Dir: h.dir, NodeName: "n1", CacheFile: cache, CacheVersion: "v1"})
	s.cache = s.loadCache()
	s.rescan(context.Background(), true)
	if s.cacheHits != 1 || len(s.firstRead) != 1 {
		t.Errorf("%d of %d files from the cache Run wrote, want 1 of 1", s.cacheHits, len(s.firstRead))
	}
	time.Sleep(3 * cacheDelay)
	if fi2, err := os.Stat(cache); err != nil || !fi2.ModTime().Equal(fi.ModTime()) {
		t.Errorf("cache rewritten though nothing changed: %v", err)
	}
}

// FuzzCacheRecord: no record, however damaged, makes the reader panic
// (a panic there would stop vipproxy at every start); what it accepts
// encodes back to the same bytes.
func FuzzCacheRecord(f *testing.F) {
	for _, p := range []string{"web.yaml", "lb.yaml", "list.json", "broken.yaml"} {
		data, err := os.ReadFile(filepath.Join("testdata", "examples", p))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(appendEntries(nil, decodeFile(p, data, "n1")))
	}
	f.Fuzz(func(t *testing.T, rec []byte) {
		r := &reader{b: rec}
		out := r.entries()
		if r.err != nil || len(r.b) != 0 {
			return
		}
		if again := appendEntries(nil, out); string(again) != string(rec) {
			// Accepted bytes need not be canonical (a varint may be
			// padded), but what they decode to must round-trip.
			r2 := &reader{b: again}
			if out2 := r2.entries(); r2.err != nil || !reflect.DeepEqual(out2, out) {
				t.Fatalf("accepted record does not round-trip")
			}
		}
	})
}

// TestCacheWait: the cache is written only once no snapshot has gone out
// for cacheQuiet.
func TestCacheWait(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		last time.Time
		want time.Duration
	}{
		{time.Time{}, 0}, // nothing sent since the first snapshot's write was scheduled long ago
		{now.Add(-2 * cacheQuiet), 0},
		{now.Add(-cacheQuiet), 0},
		{now.Add(-cacheQuiet / 4), cacheQuiet * 3 / 4},
		{now, cacheQuiet},
	} {
		if got := cacheWait(now, tc.last); got != tc.want {
			t.Errorf("last sent %v ago: wait %v, want %v", now.Sub(tc.last), got, tc.want)
		}
	}
}
