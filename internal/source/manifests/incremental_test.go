package manifests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/vipproxy/vipproxy/internal/model"
)

// TestIncrementalMatchesFull: after every kind of change, the snapshot a
// Source patches (or merges, when it must) equals a full merge, and
// in-place edits take the patch.
func TestIncrementalMatchesFull(t *testing.T) {
	dir := t.TempDir()
	content := map[string]string{}
	write := func(name, data string) {
		t.Helper()
		content[name] = data
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for f := range 10 {
		var docs []string
		for k := range 5 {
			n := fmt.Sprintf("s%d-%d", f, k)
			docs = append(docs, svcYAML(n, fmt.Sprintf("10.96.%d.%d", f, k+1), 80),
				sliceYAML(n+"-1", n, fmt.Sprintf("10.1.%d.%d", f, k+1)))
		}
		write(fmt.Sprintf("f%d.yaml", f), join(docs...))
	}
	// A Service alone in its file, its slice in another.
	write("lone-svc.yaml", svcYAML("lone", "10.96.20.1", 80))
	write("lone-slice.yaml", sliceYAML("lone-1", "lone", "10.1.20.1"))
	edit := func(name, old, new string) {
		t.Helper()
		if !strings.Contains(content[name], old) {
			t.Fatalf("%s has no %q", name, old)
		}
		write(name, strings.Replace(content[name], old, new, 1))
	}

	// full has the same history (last good versions) but always merges.
	inc, full := New(Options{Dir: dir}), New(Options{Dir: dir})
	full.noIncremental = true
	ctx := context.Background()
	inc.rescan(ctx, true)
	full.rescan(ctx, true)
	steps := []struct {
		name    string
		change  func()
		patched bool
	}{
		{"port edited", func() { edit("f1.yaml", "port: 80", "port: 81") }, true},
		{"lone Service edited", func() { edit("lone-svc.yaml", "port: 80", "port: 87") }, true},
		{"lone slice edited", func() { edit("lone-slice.yaml", `["10.1.20.1"]`, `["10.1.20.2"]`) }, true},
		{"endpoint edited", func() { edit("f2.yaml", `["10.1.2.1"]`, `["10.1.2.9", "10.1.2.8"]`) }, true},
		{"document broken", func() { edit("f3.yaml", "    port: 80", "    port: 80\n    bogus: 1") }, true},
		{"document fixed", func() { edit("f3.yaml", "    port: 80\n    bogus: 1", "    port: 82") }, true},
		{"Service added", func() { write("f4.yaml", join(content["f4.yaml"], svcYAML("new", "10.96.9.9", 80))) }, false},
		{"edit after an addition", func() { edit("f5.yaml", "port: 80", "port: 83") }, true},
		{"duplicate added", func() { write("f6.yaml", join(content["f6.yaml"], svcYAML("s0-0", "10.96.0.1", 80))) }, false},
		{"edit while a duplicate exists", func() { edit("f7.yaml", "port: 80", "port: 84") }, false},
		{"duplicate removed", func() {
			write("f6.yaml", strings.TrimSuffix(content["f6.yaml"], "---\n"+svcYAML("s0-0", "10.96.0.1", 80)))
		}, false},
		{"edit after the duplicate left", func() { edit("f8.yaml", "port: 80", "port: 85") }, true},
		{"clusterIP removed (a Problem without an allocator)", func() { edit("f9.yaml", "  clusterIP: 10.96.9.1\n", "") }, false},
		{"clusterIP back", func() { edit("f9.yaml", "spec:\n", "spec:\n  clusterIP: 10.96.9.1\n") }, false},
		{"edit after recovery", func() { edit("f0.yaml", "port: 80", "port: 86") }, true},
		{"file removed", func() { os.Remove(filepath.Join(dir, "f9.yaml")) }, false},
		{"no change", func() {}, true},
	}
	// A model.Builder fed the patched snapshots must build what a full
	// Build of the merged one does: that checks each snapshot's Patch.
	var builder model.Builder
	builder.Build(inc.inc.built, model.BuildOptions{})
	ignore := cmpopts.IgnoreFields(model.Snapshot{}, "Gen", "Patch")
	for _, step := range steps {
		step.change()
		before := inc.inc.count
		prev := inc.inc.built
		got := inc.rescan(ctx, false)
		want := full.rescan(ctx, false)
		if diff := cmp.Diff(want, got, cmpAddr, ignore); diff != "" {
			t.Fatalf("%s: snapshot differs from a full merge (-full +got):\n%s", step.name, diff)
		}
		patched := inc.inc.count > before
		if patched != step.patched {
			t.Errorf("%s: patched %v, want %v", step.name, patched, step.patched)
		}
		if got == nil {
			continue
		}
		if patched && got != prev && (got.Patch == nil || got.Patch.Base != prev.Gen || got.Gen <= prev.Gen) {
			t.Errorf("%s: patched snapshot %d has Patch %+v, want one against %d", step.name, got.Gen, got.Patch, prev.Gen)
		}
		if !patched && got.Patch != nil {
			t.Errorf("%s: merged snapshot has Patch %+v", step.name, got.Patch)
		}
		if diff := cmp.Diff(model.Build(want, model.BuildOptions{}), builder.Build(got, model.BuildOptions{}), cmpAddr); diff != "" {
			t.Fatalf("%s: Builder on the patched snapshot differs from Build (-Build +Builder):\n%s", step.name, diff)
		}
	}
}
