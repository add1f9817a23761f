package fastyaml

import (
	"strings"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

const service = `apiVersion: v1
kind: Service
metadata:
  name: web   # a comment
  namespace: "shop"
  labels: {app: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports:
  - {name: http, port: 80, targetPort: 8080, protocol: TCP}
`

const slice = `{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
 "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
 "addressType": "IPv4",
 "ports": [{"name": "http", "port": 8080}],
 "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}}]}
`

// TestDecode: the shapes of the subset decode to the typed object with
// every field set; everything outside it is declined, for the strict
// path to decode and word.
func TestDecode(t *testing.T) {
	var d Decoder
	obj, ok := d.Decode(service)
	svc, _ := obj.(*corev1.Service)
	if !ok || svc == nil {
		t.Fatalf("block Service declined: %T %v", obj, ok)
	}
	if svc.Name != "web" || svc.Namespace != "shop" || svc.Labels["app"] != "web" || svc.Spec.Type != corev1.ServiceTypeNodePort ||
		svc.Spec.ClusterIP != "10.96.0.10" || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 80 ||
		svc.Spec.Ports[0].TargetPort.IntValue() != 8080 || svc.Spec.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("Service decoded wrong: %+v", svc)
	}
	obj, ok = d.Decode(slice)
	es, _ := obj.(*discoveryv1.EndpointSlice)
	if !ok || es == nil {
		t.Fatalf("JSON EndpointSlice declined: %T %v", obj, ok)
	}
	if es.Name != "web-1" || es.AddressType != discoveryv1.AddressTypeIPv4 || len(es.Endpoints) != 1 ||
		es.Endpoints[0].Addresses[0] != "10.0.0.1" || es.Endpoints[0].Conditions.Ready == nil || !*es.Endpoints[0].Conditions.Ready ||
		*es.Ports[0].Port != 8080 {
		t.Errorf("EndpointSlice decoded wrong: %+v", es)
	}

	for _, tc := range []struct{ name, doc string }{
		{"anchor", strings.Replace(service, "type: NodePort", "type: &t NodePort", 1)},
		{"tag", strings.Replace(service, "type: NodePort", "type: !!str NodePort", 1)},
		{"block scalar", strings.Replace(service, "clusterIP: 10.96.0.10", "clusterIP: |\n    10.96.0.10", 1)},
		{"unknown field", strings.Replace(service, "type: NodePort", "tpye: NodePort", 1)},
		{"repeated key", strings.Replace(service, "type: NodePort", "type: NodePort\n  type: ClusterIP", 1)},
		{"null", strings.Replace(service, "clusterIP: 10.96.0.10", "clusterIP: null", 1)},
		{"mistyped port", strings.Replace(service, "port: 80,", "port: \"80\",", 1)},
		{"yes is a bool in YAML 1.1", strings.Replace(service, "type: NodePort", "type: yes", 1)},
		{"non-ASCII", strings.Replace(service, "# a comment", "# ünïcode", 1)},
		{"non-ASCII in a plain line", strings.Replace(service, "type: NodePort", "type: NödePort", 1)},
		{"control byte in a plain line", strings.Replace(service, "type: NodePort", "type: Node\x01Port", 1)},
		{"tab in a plain line", strings.Replace(service, "type: NodePort", "type:\tNodePort", 1)},
		{"carriage return inside a plain line", strings.Replace(service, "type: NodePort", "type: Node\rPort", 1)},
		{"non-ASCII in JSON", `{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "wéb"}}`},
		{"no name", strings.Replace(service, "name: web   # a comment", "generateName: web-", 1)},
		{"List", "apiVersion: v1\nkind: List\nmetadata:\n  name: x\nitems: []\n"},
		{"Node", "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n"},
		{"wrong apiVersion", strings.Replace(service, "apiVersion: v1", "apiVersion: v2", 1)},
		{"document marker", "---\n" + service},
		{"not a mapping", "- a\n- b\n"},
	} {
		if obj, ok := d.Decode(tc.doc); ok {
			t.Errorf("%s: accepted as %T, want declined", tc.name, obj)
		}
	}
}

// TestIntern: equal strings get one copy, which shares no memory with
// the document they came from.
func TestIntern(t *testing.T) {
	var d Decoder
	doc := "web web"
	a, b := d.Intern(doc[:3]), d.Intern(doc[4:])
	if a != "web" || unsafe.StringData(a) != unsafe.StringData(b) {
		t.Errorf("Intern(%q), Intern(%q): not one copy", a, b)
	}
	if unsafe.StringData(a) == unsafe.StringData(doc) {
		t.Error("Intern returned a view of the document")
	}
	if d.Intern("") != "" {
		t.Error(`Intern("") != ""`)
	}
}
