package manifests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"sigs.k8s.io/yaml"

	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/source/convert"
	"github.com/vipproxy/vipproxy/internal/source/manifests/fastyaml"
)

// Object kinds a manifest may hold.
const (
	kindService = "Service"
	kindSlice   = "EndpointSlice"
	kindNode    = "Node"
)

// objKey identifies an object across files: kind, namespace, name.
type objKey struct {
	Kind, Namespace, Name string
}

func (k objKey) String() string {
	if k == (objKey{}) {
		return ""
	}
	if k.Namespace == "" {
		return k.Kind + " " + k.Name
	}
	return k.Kind + " " + k.Namespace + "/" + k.Name
}

// place locates an object in its file: its document, counted from 1,
// and its index in a v1 List document's items (-1 when the document is
// the object). Two int32s rather than the text: a file's entries are
// kept while it is in force, 100,000 of them at 50,000 Services.
type place struct{ doc, item int32 }

// docPlace is document i (counted from 1) as a whole.
func docPlace(i int) place { return place{int32(i), -1} }

// String returns "document 2" or "document 2 items[0]".
func (p place) String() string {
	s := "document " + strconv.Itoa(int(p.doc))
	if p.item >= 0 {
		s += " items[" + strconv.Itoa(int(p.item)) + "]"
	}
	return s
}

// entry is one object found in a file: a document, or one item of a v1
// List document.
type entry struct {
	// where locates the object in its file.
	where place
	// key is the object's identity, zero when the document was too broken
	// to tell.
	key objKey
	// Exactly one of svc, slice and node is set when the object is usable.
	svc   *model.Service
	slice *model.EndpointSlice
	node  *model.Node
	// problems found in this object; usable objects may have some too
	// (dropped entries).
	problems []model.Problem
}

func (e *entry) usable() bool { return e.svc != nil || e.slice != nil || e.node != nil }

// decoder turns JSON documents into typed objects, strictly: unknown,
// duplicate and mistyped fields are errors.
var decoder = kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, convert.Scheme, convert.Scheme,
	kjson.SerializerOptions{Strict: true})

// header is what can be read from a document even when the strict decode
// fails: enough to name the object.
type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Items json.RawMessage `json:"items"`
}

// decodeFile decodes every document of a manifest file. name is the
// file's name as Problems show it. Nodes other than nodeName are skipped
// silently (a directory may be shared by several hosts); with nodeName ""
// every Node is skipped. decodeFile never fails as a whole: each document
// that cannot be used yields an entry with Problems (and its key, when
// the document got far enough to tell it).
func decodeFile(name string, data []byte, nodeName string) []entry {
	return decodeFileWith(name, data, nodeName, true)
}

// decodeFileWith is decodeFile; fast false forces the strict path for
// every document (tests compare the two).
func decodeFileWith(name string, data []byte, nodeName string, fast bool) []entry {
	var out []entry
	var fd *fastyaml.Decoder
	var src string
	if fast && len(data) > 0 {
		fd = &fastyaml.Decoder{}
		// A view of data, not a copy: data is not modified while the file
		// is decoded and is dropped after, and every string the fast path
		// keeps is copied out of it (detach).
		src = unsafe.String(unsafe.SliceData(data), len(data))
	}
	all := data
	for i := 1; ; i++ {
		doc, rest, err := nextDoc(data)
		if doc == nil && err == nil {
			return out
		}
		data = rest
		where := docPlace(i)
		if err != nil {
			out = append(out, entry{where: where, problems: []model.Problem{{
				Object: "file " + name + " " + where.String(), Reason: "cannot split documents: " + err.Error(),
			}}})
			return out
		}
		var sdoc string
		if fd != nil {
			off := cap(all) - cap(doc) // doc is a subslice of all
			sdoc = src[off : off+len(doc)]
		}
		out = append(out, decodeDoc(name, where, doc, sdoc, true, nodeName, fd)...)
	}
}

// nextDoc splits the next document off data without copying, as
// k8s.io/apimachinery's YAMLReader does: a line starting with "---" ends
// a document and may carry only blanks and a comment after it; empty
// documents are skipped. It returns a nil doc at the end.
func nextDoc(data []byte) (doc, rest []byte, err error) {
	start, pos := 0, 0
	for pos < len(data) {
		end := len(data)
		if i := bytes.IndexByte(data[pos:], '\n'); i >= 0 {
			end = pos + i + 1
		}
		line := data[pos:end]
		if bytes.HasPrefix(line, []byte(separator)) {
			trimmed := bytes.TrimSpace(line[len(separator):])
			if len(trimmed) > 0 && trimmed[0] != '#' {
				return nil, nil, fmt.Errorf("invalid Yaml document separator: %s", trimmed)
			}
			if pos > start {
				return data[start:pos], data[end:], nil
			}
			start = end
		}
		pos = end
	}
	if pos > start {
		return data[start:pos], nil, nil
	}
	return nil, nil, nil
}

// separator starts a line that ends a YAML document.
const separator = "---"

// decodeDoc decodes one document (or one List item when allowList is
// false). fd, when not nil, lets the fast path try first on sdoc, the same
// document as a string.
func decodeDoc(file string, where place, doc []byte, sdoc string, allowList bool, nodeName string, fd *fastyaml.Decoder) []entry {
	if allowList && fd != nil {
		if es, ok := decodeFast(fd, file, where, sdoc); ok {
			return es
		}
	}
	e := entry{where: where}
	object := "file " + file + " " + where.String()
	fail := func(field, value, reason string) []entry {
		e.problems = append(e.problems, model.Problem{Object: object, Field: field, Value: value, Reason: reason})
		return []entry{e}
	}
	// One YAML parse per document: YAMLToJSONStrict also catches duplicate
	// keys. Only when it fails is the document parsed leniently, to name
	// the object in the Problem. List items arrive as JSON already.
	j, dupErr := doc, error(nil)
	if allowList {
		var err error
		if j, err = yaml.YAMLToJSONStrict(doc); err != nil {
			if j, dupErr = yaml.YAMLToJSON(doc); dupErr != nil {
				return fail("", "", "not valid YAML: "+oneLine(dupErr.Error()))
			}
			dupErr = err
		}
	}
	if t := bytes.TrimSpace(j); len(t) == 0 || string(t) == "null" {
		return nil // empty document (only comments or a trailing ---)
	}
	var h header
	if err := json.Unmarshal(j, &h); err != nil {
		return fail("", "", "not a Kubernetes object: "+jsonReason(err))
	}
	if h.APIVersion == "v1" && h.Kind == "List" && allowList {
		var items []json.RawMessage
		if err := json.Unmarshal(h.Items, &items); err != nil && len(h.Items) > 0 {
			return fail("items", "", "must be a list of objects")
		}
		var out []entry
		for k, item := range items {
			out = append(out, decodeDoc(file, place{where.doc, int32(k)}, item, "", false, nodeName, nil)...)
		}
		return out
	}
	ns := h.Metadata.Namespace
	if ns == "" {
		ns = "default"
	}
	switch {
	case h.APIVersion == "v1" && h.Kind == kindService:
		e.key = objKey{kindService, ns, h.Metadata.Name}
	case h.APIVersion == "discovery.k8s.io/v1" && h.Kind == kindSlice:
		e.key = objKey{kindSlice, ns, h.Metadata.Name}
	case h.APIVersion == "v1" && h.Kind == kindNode:
		if nodeName == "" || h.Metadata.Name != nodeName {
			return nil
		}
		e.key = objKey{kindNode, "", h.Metadata.Name}
	case h.APIVersion == "" || h.Kind == "":
		return fail("apiVersion", h.APIVersion+" "+h.Kind, "apiVersion and kind are required")
	default:
		return fail("kind", h.APIVersion+" "+h.Kind,
			"unsupported kind: vipproxy reads v1 Service, discovery.k8s.io/v1 EndpointSlice and v1 Node")
	}
	if h.Metadata.Name == "" {
		e.key = objKey{}
		return fail("metadata.name", "", "name is required")
	}
	object += " (" + e.key.String() + ")"

	strictFailed := false
	if dupErr != nil {
		e.problems = append(e.problems, model.Problem{Object: object, Reason: oneLine(dupErr.Error())})
		strictFailed = true
	}
	obj, _, err := decoder.Decode(j, nil, nil)
	if err != nil {
		for _, p := range decodeProblems(err) {
			p.Object = object
			p.Field = indexPath(j, p.Field, p.Value)
			e.problems = append(e.problems, p)
		}
		if obj == nil || !runtime.IsStrictDecodingError(err) {
			return []entry{e}
		}
		// Only unknown or duplicate fields: the object decoded, so convert
		// it too to report every bad value at once, but refuse it.
		strictFailed = true
	}
	return finish(e, func() string { return object }, ns, h, obj, strictFailed)
}

// finish converts a decoded object into e (named by object in Problems,
// called only when there is one); strictFailed refuses it after
// conversion.
func finish(e entry, object func() string, ns string, h header, obj runtime.Object, strictFailed bool) []entry {
	fail := func(field, value, reason string) []entry {
		e.problems = append(e.problems, model.Problem{Object: object(), Field: field, Value: value, Reason: reason})
		return []entry{e}
	}
	var ps []model.Problem
	switch o := obj.(type) {
	case *corev1.Service:
		o.Namespace = ns
		if !convert.Proxied(o) {
			return nil // not ours to proxy, exactly as in a cluster
		}
		svc, cps := convert.StrictService(o)
		ps = cps
		if svc.Name != "" {
			e.svc = &svc
		}
	case *discoveryv1.EndpointSlice:
		o.Namespace = ns
		if o.Labels[discoveryv1.LabelServiceName] == "" {
			return fail("metadata.labels["+discoveryv1.LabelServiceName+"]", "",
				"required: it names the Service the slice belongs to")
		}
		sl, cps := convert.StrictEndpointSlice(o)
		ps = cps
		if sl.Name != "" {
			e.slice = &sl
		} else if len(cps) == 0 {
			return nil // FQDN slice: ignored as upstream does
		}
	case *corev1.Node:
		e.node = convert.Node(o)
	default:
		return fail("kind", h.APIVersion+" "+h.Kind, fmt.Sprintf("decoded to unexpected %T", obj))
	}
	if len(ps) > 0 {
		name := object()
		for _, p := range ps {
			p.Object = name
			e.problems = append(e.problems, p)
		}
	}
	if strictFailed {
		e.svc, e.slice, e.node = nil, nil, nil
	}
	if !e.usable() && len(e.problems) == 0 {
		// Defensive: a refusal must always say why.
		return fail("", "", "object refused")
	}
	return []entry{e}
}

var (
	// json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32
	typeErrRE = regexp.MustCompile(`cannot unmarshal (.+) into Go struct field [^.\s]+\.(\S+) of type (\S+)`)
	// unknown field "spec.ports[0].foo" / duplicate field "spec.type"
	strictRE = regexp.MustCompile(`^(unknown|duplicate) field "([^"]*)"$`)
)

// decodeProblems turns a strict decoding error into Problems that name
// the field where the error says which.
func decodeProblems(err error) []model.Problem {
	if se, ok := runtime.AsStrictDecodingError(err); ok {
		var out []model.Problem
		for _, e := range se.Errors() {
			if m := strictRE.FindStringSubmatch(e.Error()); m != nil {
				out = append(out, model.Problem{Field: m[2], Reason: m[1] + " field"})
			} else {
				out = append(out, model.Problem{Reason: oneLine(e.Error())})
			}
		}
		return out
	}
	return []model.Problem{problemFromError(err)}
}

func problemFromError(err error) model.Problem {
	msg := err.Error()
	if m := typeErrRE.FindStringSubmatch(msg); m != nil {
		return model.Problem{Field: m[2], Value: m[1], Reason: "wrong type: want " + m[3]}
	}
	return model.Problem{Reason: oneLine(msg)}
}

// oneLine folds a multi-line error message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// jsonReason shortens encoding/json errors for a header decode.
func jsonReason(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return "document is not a mapping (got " + te.Value + ")"
		}
		return fmt.Sprintf("%s is a %s, want %s", te.Field, te.Value, te.Type)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// indexPath adds list indices to a dotted field path from a JSON type
// error ("spec.ports.port" → "spec.ports[1].port") by finding, in the
// document, the first element whose value at that path has the JSON kind
// the error names (value is "string", "number 7", "bool", "array" or
// "object"). It returns field unchanged when it cannot tell.
func indexPath(doc []byte, field, value string) string {
	if field == "" || value == "" {
		return field
	}
	var root any
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	if err := d.Decode(&root); err != nil {
		return field
	}
	if p, ok := findKind(root, strings.Split(field, "."), value, ""); ok {
		return p
	}
	return field
}

// findKind looks for the first value at path (descending into lists) that
// matches the type error's value.
func findKind(v any, path []string, kind, prefix string) (string, bool) {
	if list, ok := v.([]any); ok {
		for i, el := range list {
			if p, ok := findKind(el, path, kind, fmt.Sprintf("%s[%d]", prefix, i)); ok {
				return p, true
			}
		}
		return "", false
	}
	if len(path) == 0 {
		return prefix, matchesKind(v, kind)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return "", false
	}
	child, ok := m[path[0]]
	if !ok {
		return "", false
	}
	next := path[0]
	if prefix != "" {
		next = prefix + "." + path[0]
	}
	if len(path) == 1 {
		// The leaf itself may be a list of the wrong kind, or a list whose
		// element has the wrong kind.
		if matchesKind(child, kind) {
			return next, true
		}
	}
	return findKind(child, path[1:], kind, next)
}

// matchesKind reports whether v is what a type error's value describes:
// "string", "bool", "array", "object", "number" or "number 42".
func matchesKind(v any, value string) bool {
	kind, literal, _ := strings.Cut(value, " ")
	if n, ok := v.(json.Number); ok && kind == "number" && literal != "" {
		return string(n) == literal
	}
	return jsonKind(v) == kind
}

func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "bool"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "null"
}
