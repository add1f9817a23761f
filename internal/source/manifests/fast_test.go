package manifests

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vipproxy/vipproxy/internal/source/manifests/fastyaml"
)

// fastCases are documents in shapes the fast path must handle itself
// (fast true) or leave to the strict path (fast false). Either way the
// entries must equal the strict path's.
var fastCases = []struct {
	name string
	doc  string
	fast bool
}{
	{"service", svcYAML("web", "10.96.0.10", 80), true},
	{"slice", sliceYAML("web-1", "web", "10.0.0.1"), true},
	{"service without clusterIP", svcYAML("web", "", 80), true},
	{"full service", `apiVersion: v1
kind: Service
metadata:
  name: lb # a comment
  namespace: prod
  labels: {app: lb, "tier": 'front'}
  annotations:
    service.beta.kubernetes.io/load-balancer-source-ranges: "10.0.0.0/8"
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20]
  ipFamilies: [IPv4]
  ipFamilyPolicy: SingleStack
  externalIPs:
  - 192.0.2.1
  - "192.0.2.2"
  externalTrafficPolicy: Local
  internalTrafficPolicy: Cluster
  healthCheckNodePort: 30999
  sessionAffinity: ClientIP
  sessionAffinityConfig:
    clientIP:
      timeoutSeconds: 300
  selector:
    app: lb
  publishNotReadyAddresses: false
  trafficDistribution: PreferClose
  ports:
  - name: https
    protocol: TCP
    port: 443
    targetPort: https
    nodePort: 30443
    appProtocol: h2
  - name: http
    port: 80
    targetPort: 8080
status:
  loadBalancer:
    ingress:
    - ip: 203.0.113.7
      ipMode: VIP
    - hostname: lb.example.com
`, true},
	// After "full service": a reused annotations map must not keep its
	// source ranges.
	{"service with another annotation", `apiVersion: v1
kind: Service
metadata:
  name: other
  namespace: prod
  annotations: {example.com/note: x}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.21
  ports: [{port: 80}]
`, true},
	{"full slice", `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: lb-1
  namespace: prod
  labels:
    kubernetes.io/service-name: lb
addressType: IPv4
ports:
- name: https
  protocol: TCP
  port: 8443
  appProtocol: h2
endpoints:
- addresses:
  - 10.1.0.1
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: n1
  zone: z1
  hostname: pod-a
  hints:
    forZones: [{name: z1}]
    forNodes:
    - name: n1
- addresses: ["10.1.0.2"]
  conditions:
    ready: false
`, true},
	{"JSON service", `{"apiVersion":"v1","kind":"Service","metadata":{"name":"j","namespace":"x"},
  "spec":{"clusterIP":"10.96.0.30","ports":[{"name":"a","port":53,"protocol":"UDP"},{"name":"b","port":53}]}}`, true},
	{"invalid value still fast", svcYAML("web", "10.96.0.10", 0), true},
	{"bad clusterIP still fast", svcYAML("web", "nope", 80), true},
	{"IPv6 clusterIP", svcYAML("web", "fd00::10", 80), true},
	// Left to the strict path.
	{"unknown field", strings.Replace(svcYAML("web", "10.96.0.10", 80), "    port: 80", "    port: 80\n    bogus: 1", 1), false},
	{"quoted port", strings.Replace(svcYAML("web", "10.96.0.10", 80), "port: 80", `port: "80"`, 1), false},
	{"port out of int32", strings.Replace(svcYAML("web", "10.96.0.10", 80), "port: 80", "port: 99999999999", 1), false},
	{"negative port", strings.Replace(svcYAML("web", "10.96.0.10", 80), "port: 80", "port: -1", 1), false},
	{"yes as a bool", strings.Replace(sliceYAML("s", "web", "10.0.0.1"), `- addresses: ["10.0.0.1"]`, "- addresses: [\"10.0.0.1\"]\n  conditions: {ready: yes}", 1), false},
	{"label value a bool", strings.Replace(svcYAML("web", "10.96.0.10", 80), "  name: web\n", "  name: web\n  labels: {a: true}\n", 1), false},
	{"label key y", strings.Replace(svcYAML("web", "10.96.0.10", 80), "  name: web\n", "  name: web\n  labels: {y: a}\n", 1), false},
	{"duplicate key", "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80, port: 81}]\n", false},
	{"null value", "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP:\n  ports: [{port: 80}]\n", false},
	{"anchor", "apiVersion: v1\nkind: Service\nmetadata: &m {name: web}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80}]\n", false},
	{"block scalar", "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations:\n    a: |\n      x\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80}]\n", false},
	{"multi-line plain scalar", "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations:\n    a: x\n      y\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80}]\n", false},
	{"flow key without space", "apiVersion: v1\nkind: Service\nmetadata: {name:web}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80}]\n", false},
	{"timestamp-like name", "apiVersion: v1\nkind: Service\nmetadata: {name: 2024-01-01}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80}]\n", false},
	{"node", "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n", false},
	{"list", `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"clusterIP":"10.96.0.1","ports":[{"port":1}]}}]}`, false},
	{"tab indent", "apiVersion: v1\nkind: Service\nmetadata:\n\tname: web\n", false},
	{"non-ASCII", strings.Replace(svcYAML("web", "10.96.0.10", 80), "name: http", "name: h\u00e9", 1), false},
	{"invalid UTF-8", strings.Replace(svcYAML("web", "10.96.0.10", 80), "name: http", "name: h\xffp", 1), false},
	{"control character", strings.Replace(svcYAML("web", "10.96.0.10", 80), "name: http", "name: h\x01p", 1), false},
	{"CRLF", strings.ReplaceAll(svcYAML("web", "10.96.0.10", 80), "\n", "\r\n"), true},
}

// TestFastMatchesStrict checks the fast path's contract: it decodes the
// documents it accepts exactly as the strict path does, and accepts the
// common shapes.
func TestFastMatchesStrict(t *testing.T) {
	for _, tc := range fastCases {
		t.Run(tc.name, func(t *testing.T) {
			_, took := decodeFast(&fastyaml.Decoder{}, "f.yaml", docPlace(1), tc.doc)
			if took != tc.fast {
				t.Errorf("fast path took the document: %v, want %v", took, tc.fast)
			}
			fast := decodeFileWith("f.yaml", []byte(tc.doc), "n1", true)
			strict := decodeFileWith("f.yaml", []byte(tc.doc), "n1", false)
			if !reflect.DeepEqual(fast, strict) {
				t.Errorf("fast path differs:\nfast:   %s\nstrict: %s", summary(fast), summary(strict))
			}
			if len(strict) == 0 {
				t.Errorf("no entries: the case tests nothing")
			}
		})
	}
}

// TestFastReusesNothingKept: one Decoder decodes every document of a
// file, reusing the objects it returns (fastyaml's scratch); every entry
// must still equal the strict path's, whatever came before it. The cases
// are joined into one file in order and reversed, so each shape follows
// others (labels after none, fewer endpoints after more, ...).
func TestFastReusesNothingKept(t *testing.T) {
	var docs []string
	for _, tc := range fastCases {
		docs = append(docs, tc.doc)
	}
	for _, order := range []string{"in order", "reversed"} {
		if order == "reversed" {
			slices.Reverse(docs)
		}
		var b strings.Builder
		for _, d := range docs {
			b.WriteString(d)
			b.WriteString("\n---\n")
		}
		data := []byte(b.String())
		fast := decodeFileWith("f.yaml", data, "n1", true)
		strict := decodeFileWith("f.yaml", data, "n1", false)
		if len(strict) < len(docs) {
			t.Fatalf("%s: %d entries for %d documents", order, len(strict), len(docs))
		}
		if !reflect.DeepEqual(fast, strict) {
			t.Errorf("%s: fast path differs:\nfast:   %s\nstrict: %s", order, summary(fast), summary(strict))
		}
	}
}

// TestFastMatchesStrictOnFiles compares the two paths on the example
// manifests and the fuzz corpus.
func TestFastMatchesStrictOnFiles(t *testing.T) {
	for _, p := range exampleFiles(t) {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		fast := decodeFileWith("f.yaml", data, "n1", true)
		strict := decodeFileWith("f.yaml", data, "n1", false)
		if !reflect.DeepEqual(fast, strict) {
			t.Errorf("%s: fast path differs:\nfast:   %s\nstrict: %s", p, summary(fast), summary(strict))
		}
	}
}

func TestNextDoc(t *testing.T) {
	tests := []struct {
		data string
		want []string
		err  bool
	}{
		{data: "", want: nil},
		{data: "a: 1\n", want: []string{"a: 1\n"}},
		{data: "a: 1", want: []string{"a: 1"}},
		{data: "---\na: 1\n---\n---\nb: 2\n--- # c\n", want: []string{"a: 1\n", "b: 2\n"}},
		{data: "a: 1\n---x\n", want: nil, err: true}, // as YAMLReader: the document is lost
		{data: "a: 1\n ---\n", want: []string{"a: 1\n ---\n"}},
	}
	for _, tc := range tests {
		var got []string
		data, gotErr := []byte(tc.data), false
		for {
			doc, rest, err := nextDoc(data)
			if err != nil {
				gotErr = true
				break
			}
			if doc == nil {
				break
			}
			got = append(got, string(doc))
			data = rest
		}
		if !reflect.DeepEqual(got, tc.want) || gotErr != tc.err {
			t.Errorf("nextDoc(%q) = %q, err %v; want %q, err %v", tc.data, got, gotErr, tc.want, tc.err)
		}
	}
}

// TestFastKeepsNoView: the fast path decodes from a view of the file's
// bytes; nothing it returns may still point into them. Overwriting the
// bytes after decoding must not change the entries.
func TestFastKeepsNoView(t *testing.T) {
	var docs []string
	for _, tc := range fastCases {
		if tc.fast {
			docs = append(docs, tc.doc)
		}
	}
	text := join(docs...)
	want := decodeFileWith("f.yaml", []byte(text), "n1", false)
	data := []byte(text)
	got := decodeFileWith("f.yaml", data, "n1", true)
	for i := range data {
		data[i] = 'X'
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("entries changed with the file's bytes:\ngot:  %s\nwant: %s", summary(got), summary(want))
	}
	if len(want) < 8 {
		t.Fatalf("only %d entries: the test covers too little", len(want))
	}
}

// exampleFiles lists the example manifests and the fuzz corpus.
func exampleFiles(t *testing.T) []string {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join("testdata", "examples", "*"))
	corpus, _ := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzDecode", "*"))
	if len(paths) == 0 || len(corpus) == 0 {
		t.Fatal("no test data")
	}
	return append(paths, corpus...)
}
