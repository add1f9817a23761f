package manifests

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

// FuzzDecode feeds arbitrary bytes through the manifest decoder, the
// converter and model.Build, and checks that
//   - nothing panics and decoding is deterministic;
//   - the fast path decodes exactly as the strict path does;
//   - every refused document says why (no Problem-free refusal), and every
//     Problem names this file;
//   - every ServicePort Build produces passes ServicePort.Validate.
//
// Seeds: testdata/examples/* and testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	paths, _ := filepath.Glob(filepath.Join("testdata", "examples", "*"))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(svcYAML("web", "10.96.0.10", 80) + "---\n" + sliceYAML("web-1", "web", "10.0.0.1")))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries := decodeFile("fuzz.yaml", data, "n1")
		if again := decodeFile("fuzz.yaml", data, "n1"); !reflect.DeepEqual(entries, again) {
			t.Fatal("decoding is not deterministic")
		}
		if strict := decodeFileWith("fuzz.yaml", data, "n1", false); !reflect.DeepEqual(entries, strict) {
			t.Fatalf("fast path differs from the strict path:\nfast:   %+v\nstrict: %+v", entries, strict)
		}
		snap := &model.Snapshot{}
		for _, e := range entries {
			if !e.usable() && len(e.problems) == 0 {
				t.Fatalf("%s refused without a Problem", e.where)
			}
			for _, p := range e.problems {
				if !strings.HasPrefix(p.Object, "file fuzz.yaml document ") || p.Reason == "" {
					t.Fatalf("problem does not name the file and document or has no reason: %#v", p)
				}
			}
			switch {
			case e.svc != nil:
				snap.Services = append(snap.Services, e.svc)
			case e.slice != nil:
				snap.Slices = append(snap.Slices, e.slice)
			case e.node != nil:
				snap.Node = e.node
			}
		}
		// The last-good merge must keep every usable entry.
		good, _ := keepLastGood("fuzz.yaml", nil, entries)
		usable := 0
		for _, e := range entries {
			if e.usable() {
				usable++
			}
		}
		if len(good) != usable {
			t.Fatalf("keepLastGood kept %d of %d usable entries", len(good), usable)
		}
		st := model.Build(snap, model.BuildOptions{NodeName: "n1"})
		for _, sp := range st.Ports {
			if err := sp.Validate(); err != nil {
				t.Fatalf("Build produced an invalid ServicePort %s: %v", sp.Name, err)
			}
		}
	})
}
