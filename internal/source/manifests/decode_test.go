package manifests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipproxy/vipproxy/internal/model"
)

// summary renders entries as "where key usable|refused" plus one
// "  field=value" line per problem.
func summary(entries []entry) string {
	var b strings.Builder
	for _, e := range entries {
		state := "refused"
		if e.usable() {
			state = "usable"
		}
		b.WriteString(e.where.String() + " " + e.key.String() + " " + state + "\n")
		for _, p := range e.problems {
			b.WriteString("  " + p.Field + "=" + p.Value + "\n")
		}
	}
	return b.String()
}

func TestDecodeFile(t *testing.T) {
	tests := []struct {
		name, data, want string
	}{
		{name: "empty file", data: "", want: ""},
		{name: "only comments and separators", data: "# hi\n---\n---\n", want: ""},
		{
			name: "service and slice",
			data: join(svcYAML("web", "10.96.0.10", 80), sliceYAML("web-1", "web", "10.0.0.1")),
			want: "document 1 Service default/web usable\ndocument 2 EndpointSlice default/web-1 usable\n",
		},
		{
			name: "YAML syntax error",
			data: "apiVersion: v1\nkind: Service\nmetadata: {name: web\n",
			want: "document 1  refused\n  =\n",
		},
		{
			name: "unknown field named with its index",
			data: strings.Replace(svcYAML("web", "10.96.0.10", 80), "    port: 80", "    port: 80\n    bogus: 1", 1),
			want: "document 1 Service default/web refused\n  spec.ports[0].bogus=\n",
		},
		{
			name: "mistyped field",
			data: strings.Replace(svcYAML("web", "10.96.0.10", 80), "port: 80", "port: eighty", 1),
			want: "document 1 Service default/web refused\n  spec.ports[0].port=string\n",
		},
		{
			name: "mistyped field in the second list entry",
			data: strings.Replace(svcYAML("web", "10.96.0.10", 80), "    port: 80", "    port: 80\n  - name: b\n    port: 99999999999", 1),
			want: "document 1 Service default/web refused\n  spec.ports[1].port=number 99999999999\n",
		},
		{
			name: "mistyped list",
			data: strings.Replace(svcYAML("web", "10.96.0.10", 80), "spec:", "spec:\n  externalIPs: 1.2.3.4", 1),
			want: "document 1 Service default/web refused\n  spec.externalIPs=string\n",
		},
		{
			name: "mistyped list element",
			data: strings.Replace(sliceYAML("s", "web", "10.0.0.1"), `- addresses: ["10.0.0.1"]`, `- addresses: ["10.0.0.1", 7]`, 1),
			want: "document 1 EndpointSlice default/s refused\n  endpoints[0].addresses[1]=number\n",
		},
		{
			name: "invalid value refused with its path",
			data: svcYAML("web", "10.96.0.10", 0),
			want: "document 1 Service default/web refused\n  spec.ports[0].port=0\n",
		},
		{
			name: "non-fatal problem keeps the object",
			data: strings.Replace(svcYAML("web", "10.96.0.10", 80), "spec:", "spec:\n  externalIPs: [1.2.3.4, nope]", 1),
			want: "document 1 Service default/web usable\n  spec.externalIPs[1]=nope\n",
		},
		{
			name: "duplicate YAML key refuses the object, named",
			data: "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80, port: 81}]\n",
			want: "document 1 Service default/web refused\n  =\n",
		},
		{
			name: "duplicate JSON key refuses the object, named",
			data: `{"apiVersion":"v1","kind":"Service","metadata":{"name":"web"},"spec":{"clusterIP":"10.96.0.1","clusterIP":"10.96.0.2","ports":[{"port":80}]}}`,
			want: "document 1 Service default/web refused\n  =\n",
		},
		{
			name: "unsupported kind",
			data: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
			want: "document 1  refused\n  kind=v1 ConfigMap\n",
		},
		{
			name: "old EndpointSlice API version",
			data: strings.Replace(sliceYAML("s", "web", "10.0.0.1"), "discovery.k8s.io/v1", "discovery.k8s.io/v1beta1", 1),
			want: "document 1  refused\n  kind=discovery.k8s.io/v1beta1 EndpointSlice\n",
		},
		{
			name: "missing apiVersion",
			data: "kind: Service\nmetadata: {name: x}\n",
			want: "document 1  refused\n  apiVersion= Service\n",
		},
		{
			name: "missing name",
			data: "apiVersion: v1\nkind: Service\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n",
			want: "document 1  refused\n  metadata.name=\n",
		},
		{
			name: "not a mapping",
			data: "- a\n- b\n",
			want: "document 1  refused\n  =\n",
		},
		{
			name: "slice without service-name label",
			data: strings.Replace(sliceYAML("s", "web", "10.0.0.1"), "    kubernetes.io/service-name: web\n", "    app: web\n", 1),
			want: "document 1 EndpointSlice default/s refused\n  metadata.labels[kubernetes.io/service-name]=\n",
		},
		{
			name: "FQDN slice ignored",
			data: strings.Replace(sliceYAML("s", "web", "example.com"), "IPv4", "FQDN", 1),
			want: "",
		},
		{
			name: "labelled Service ignored",
			data: strings.Replace(svcYAML("web", "10.96.0.10", 80), "  name: web\n", "  name: web\n  labels: {service.kubernetes.io/service-proxy-name: other}\n", 1),
			want: "",
		},
		{
			name: "other node ignored, own node used",
			data: join("apiVersion: v1\nkind: Node\nmetadata: {name: n2}\n", "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n"),
			want: "document 2 Node n1 usable\n",
		},
		{
			name: "List with a bad item",
			data: `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"clusterIP":"10.96.0.1","ports":[{"port":1}]}},{"kind":"x"}]}`,
			want: "document 1 items[0] Service default/a usable\ndocument 1 items[1]  refused\n  apiVersion= x\n",
		},
		{
			name: "List whose items are not a list",
			data: `{"apiVersion":"v1","kind":"List","items":{"a":1}}`,
			want: "document 1  refused\n  items=\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			entries := decodeFile("f.yaml", []byte(tc.data), "n1")
			if diff := cmp.Diff(tc.want, summary(entries)); diff != "" {
				t.Errorf("entries (-want +got):\n%s", diff)
			}
			for _, e := range entries {
				for _, p := range e.problems {
					if !strings.HasPrefix(p.Object, "file f.yaml "+e.where.String()) || p.Reason == "" {
						t.Errorf("problem %#v does not name file and document or lacks a reason", p)
					}
				}
			}
		})
	}
}

// TestExamples checks the example manifests (also the fuzz seeds) build
// into the ServicePorts they describe.
func TestExamples(t *testing.T) {
	tests := []struct {
		file      string
		ports     []string
		problems  int
		endpoints map[string]int
	}{
		{file: "web.yaml", ports: []string{"default/web:dns/UDP", "default/web:http/TCP"}, endpoints: map[string]int{"default/web:http/TCP": 2}, problems: 1}, // 127.0.0.1 endpoint refused by Build
		{file: "lb.yaml", ports: []string{"prod/lb:https/TCP"}, endpoints: map[string]int{"prod/lb:https/TCP": 1}},
		{file: "list.json", ports: []string{"default/np/TCP"}},
		{file: "broken.yaml", problems: 6},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "examples", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			snap := &model.Snapshot{}
			for _, e := range decodeFile(tc.file, data, "n1") {
				snap.Problems = append(snap.Problems, e.problems...)
				switch {
				case e.svc != nil:
					snap.Services = append(snap.Services, e.svc)
				case e.slice != nil:
					snap.Slices = append(snap.Slices, e.slice)
				case e.node != nil:
					snap.Node = e.node
				}
			}
			st := model.Build(snap, model.BuildOptions{})
			var ports []string
			for _, sp := range st.Ports {
				ports = append(ports, sp.Name.String())
				if want, ok := tc.endpoints[sp.Name.String()]; ok && len(sp.Endpoints) != want {
					t.Errorf("%s: %d endpoints, want %d", sp.Name, len(sp.Endpoints), want)
				}
			}
			if diff := cmp.Diff(tc.ports, ports); diff != "" {
				t.Errorf("ports (-want +got):\n%s", diff)
			}
			if len(st.Problems) != tc.problems {
				t.Errorf("%d problems, want %d:", len(st.Problems), tc.problems)
				for _, p := range st.Problems {
					t.Log(p.Error())
				}
			}
		})
	}
}
