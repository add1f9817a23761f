package manifests

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipproxy/vipproxy/internal/model"
)

// cmpAddr compares netip values by value.
var cmpAddr = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

// TestParallelMatchesSerial: decoding files in parallel gives the same
// snapshot (objects, duplicates and Problems, in the same order) as
// decoding them one by one, on a cold read and after a change.
func TestParallelMatchesSerial(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for f := range 24 {
		var docs []string
		for k := range 5 {
			n := fmt.Sprintf("s%02d-%d", f, k)
			docs = append(docs, svcYAML(n, fmt.Sprintf("10.96.%d.%d", f, k+1), 80),
				sliceYAML(n+"-1", n, fmt.Sprintf("10.1.%d.%d", f, k+1)))
		}
		switch f {
		case 3: // duplicate of an object in f02
			docs = append(docs, svcYAML("s02-0", "10.96.2.1", 80))
		case 5: // strict-path Problem with a field path
			docs = append(docs, strings.Replace(svcYAML("bad", "10.96.99.1", 80), "    port: 80", "    port: 80\n    bogus: 1", 1))
		case 7: // not YAML
			docs = append(docs, "apiVersion: v1\nkind: Service\nmetadata: {name: web\n")
		case 9: // fast-path Problem (invalid value)
			docs = append(docs, svcYAML("zero", "10.96.99.2", 0))
		}
		write(fmt.Sprintf("f%02d.yaml", f), join(docs...))
	}
	write("empty.yaml", "")

	serial, parallel := New(Options{Dir: dir}), New(Options{Dir: dir})
	serial.workers, parallel.workers = 1, 4
	ctx := context.Background()
	want := serial.rescan(ctx, true)
	got := parallel.rescan(ctx, false)
	if diff := cmp.Diff(want, got, cmpAddr); diff != "" {
		t.Fatalf("cold read: parallel snapshot differs (-serial +parallel):\n%s", diff)
	}
	if len(got.Services) != 120 || len(got.Slices) != 120 {
		t.Fatalf("cold read: %d services, %d slices", len(got.Services), len(got.Slices))
	}
	var problems []string
	for _, p := range got.Problems {
		problems = append(problems, p.Error())
	}
	for _, want := range []string{
		"file f03.yaml document 11 (Service default/s02-0): metadata.name",
		"file f05.yaml document 11 (Service default/bad): spec.ports[0].bogus",
		"file f07.yaml document 11: ",
		"file f09.yaml document 11 (Service default/zero): spec.ports[0].port",
	} {
		found := false
		for _, p := range problems {
			found = found || strings.HasPrefix(p, want)
		}
		if !found {
			t.Errorf("no Problem starting %q in:\n%s", want, strings.Join(problems, "\n"))
		}
	}

	write("f04.yaml", svcYAML("s04-0", "10.96.4.9", 81))
	write("f05.yaml", join(svcYAML("s05-0", "10.96.5.1", 80), svcYAML("s05-1", "10.96.5.2", 80)))
	os.Remove(filepath.Join(dir, "f06.yaml"))
	want = serial.rescan(ctx, true)
	got = parallel.rescan(ctx, false)
	if diff := cmp.Diff(want, got, cmpAddr); diff != "" {
		t.Fatalf("after a change: parallel snapshot differs (-serial +parallel):\n%s", diff)
	}
	if len(got.Services) != 108 || len(got.Slices) != 105 {
		t.Errorf("after a change: %d services, %d slices", len(got.Services), len(got.Slices))
	}
}

// TestCompareNames: compareNames orders as the String() forms do.
func TestCompareNames(t *testing.T) {
	pairs := [][2]string{
		{"a", "b"}, {"a-x", "a"}, {"a", "a"}, {"ab", ""}, {"a", ""}, {"", "z"},
		{"a/b", "c"}, {"a", "b/c"}, {"b", "a"}, {"default", "web"}, {"default", "web-1"},
	}
	var names []model.ServiceName
	for _, p := range pairs {
		names = append(names, model.ServiceName{Namespace: p[0], Name: p[1]})
	}
	for _, x := range names {
		for _, y := range names {
			want := strings.Compare(x.String(), y.String())
			if got := compareNames(x, y); got != want {
				t.Errorf("compareNames(%v, %v) = %d, want %d", x, y, got, want)
			}
		}
	}
}
