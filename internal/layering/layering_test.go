// Package layering holds the test that keeps vipproxy's import direction:
// source → model → reconcile → dataplane, with API types stripped at the
// source boundary.
package layering

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/vipproxy/vipproxy"

type pkg struct {
	ImportPath string
	Deps       []string
	Standard   bool
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-deps=false", "-json=ImportPath,Deps,Standard", module+"/...")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(out)
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	return pkgs
}

func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// TestImportDirection checks the rules of DESIGN.md on every package's
// transitive dependencies.
func TestImportDirection(t *testing.T) {
	rules := []struct {
		name      string
		applies   func(string) bool
		forbidden func(dep string) bool
	}{
		{
			name:    "model uses the standard library only",
			applies: func(p string) bool { return under(p, module+"/internal/model") },
			forbidden: func(d string) bool {
				first, _, _ := strings.Cut(d, "/")
				return strings.Contains(first, ".")
			},
		},
		{
			name:      "dataplanes import no sources and no Kubernetes API",
			applies:   func(p string) bool { return under(p, module+"/internal/dataplane") },
			forbidden: func(d string) bool { return under(d, module+"/internal/source") || kubeAPI(d) },
		},
		{
			name: "nothing past the source boundary imports Kubernetes API types",
			applies: func(p string) bool {
				for _, ok := range []string{"/internal/source", "/internal/config", "/cmd", "/test", "/bench"} {
					if under(p, module+ok) {
						return false
					}
				}
				return true
			},
			forbidden: kubeAPI,
		},
		{
			// The binary links only the API groups it reads: client-go's
			// clientset, informers, listers and apply configurations
			// for every built-in group doubled its size and cost every
			// process 16 MiB of resident pages (convert.Scheme).
			name: "the binary links only core/v1 and discovery/v1 of the Kubernetes API",
			applies: func(p string) bool {
				return under(p, module+"/cmd") || under(p, module+"/internal")
			},
			forbidden: func(d string) bool {
				for _, big := range []string{"kubernetes", "informers", "listers", "applyconfigurations"} {
					if under(d, "k8s.io/client-go/"+big) {
						return true
					}
				}
				return under(d, "k8s.io/api") && !under(d, "k8s.io/api/core/v1") && !under(d, "k8s.io/api/discovery/v1")
			},
		},
		{
			name: "reconcile and model know no source",
			applies: func(p string) bool {
				return under(p, module+"/internal/reconcile") || under(p, module+"/internal/model")
			},
			forbidden: func(d string) bool { return under(d, module+"/internal/source") },
		},
	}
	pkgs := listPackages(t)
	if len(pkgs) < 3 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			for _, p := range pkgs {
				if !r.applies(p.ImportPath) || strings.HasSuffix(p.ImportPath, "/layering") {
					continue
				}
				for _, d := range p.Deps {
					if r.forbidden(d) {
						t.Errorf("%s imports %s", p.ImportPath, d)
					}
				}
			}
		})
	}
}

// kubeAPI reports whether an import path is a Kubernetes API or client package.
func kubeAPI(d string) bool {
	return under(d, "k8s.io/api") || under(d, "k8s.io/client-go") || under(d, "k8s.io/apimachinery")
}
