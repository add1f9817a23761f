package convert

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

// Scheme knows the API groups vipproxy reads, core/v1 and
// discovery.k8s.io/v1, and nothing else. Both sources decode with it
// (the manifests source its documents, the Kubernetes source the API
// server's responses) instead of client-go's kubernetes/scheme, which
// registers every built-in API group: linking those 56 packages, their
// typed clients, informers, listers and apply configurations made the
// binary about 25 MB larger and every process pay for their pages and
// their registration at start.
var Scheme = runtime.NewScheme()

// Codecs are Scheme's serializers (JSON, YAML, protobuf, CBOR).
var Codecs = serializer.NewCodecFactory(Scheme)

// ParameterCodec encodes list, watch and get options as query parameters.
var ParameterCodec = runtime.NewParameterCodec(Scheme)

func init() {
	// Registration of these fixed types cannot fail; a panic here is a
	// build defect, found by any test of this package.
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme} {
		if err := add(Scheme); err != nil {
			panic(err)
		}
	}
	// Unversioned meta types (Status, WatchEvent, options), as client-go's
	// scheme registers them.
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
}
