// Package fastyaml decodes the common shape of a hand-written Service or
// EndpointSlice manifest (block and single-line flow YAML, or JSON; plain
// and quoted scalars) straight into the Kubernetes struct, without the
// YAML → JSON → reflection round trip of the strict path
// (sigs.k8s.io/yaml and the API machinery's strict decoder), which costs
// about 100 µs per object.
//
// Its contract: Decode accepts a document only when the strict path would
// decode it to exactly the same object without error. It is sure of that
// only when every key is a known field of the expected type, no key is
// repeated, and every scalar resolves (under YAML 1.1, as sigs.k8s.io/yaml
// does) unambiguously to the type the field wants. Anything else —
// anchors, tags, block scalars, multi-line scalars, nulls, unknown or
// mistyped fields, Lists, Nodes, other kinds — makes it decline, and the
// caller decodes the document on the strict path, which words any
// Problem. The manifests package checks the contract against the strict
// path (TestFastMatchesStrict, FuzzDecode).
package fastyaml

import (
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
)

// Decoder decodes documents one at a time; it reuses its parse buffers
// from one document to the next. It is not safe for concurrent use.
type Decoder struct {
	p yparser
	s scratch
	// strs interns the strings Intern copies.
	strs map[string]string
}

// Decode returns doc as a *corev1.Service (apiVersion v1) or a
// *discoveryv1.EndpointSlice (apiVersion discovery.k8s.io/v1) with a
// non-empty metadata.name, or false when the caller must decode doc on
// the strict path. The object is valid until the next call of Decode on
// d, which reuses its memory; its strings may be substrings of doc: pass
// them through Intern to keep them beyond doc's life.
func (d *Decoder) Decode(doc string) (runtime.Object, bool) {
	root, ok := d.p.parse(doc)
	if !ok {
		return nil, false
	}
	h, ok := fastHeader(root)
	if !ok || h.name == "" {
		return nil, false
	}
	d.s.reset()
	switch {
	case h.apiVersion == "v1" && h.kind == "Service":
		if svc, ok := d.s.service(root); ok {
			return svc, true
		}
	case h.apiVersion == "discovery.k8s.io/v1" && h.kind == "EndpointSlice":
		if es, ok := d.s.slice(root); ok {
			return es, true
		}
	}
	return nil, false
}

// Intern returns a copy of s that shares no memory with any document, the
// same copy for equal strings passed to this Decoder.
func (d *Decoder) Intern(s string) string {
	if s == "" {
		return ""
	}
	if c, ok := d.strs[s]; ok {
		return c
	}
	if d.strs == nil {
		d.strs = map[string]string{}
	}
	c := strings.Clone(s)
	d.strs[c] = c
	return c
}
