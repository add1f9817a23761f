package manifests

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vipproxy/vipproxy/internal/model"
)

// The fast path decodes the common shape of a hand-written manifest (block
// and single-line flow YAML, or JSON; plain and quoted scalars) straight
// into the Kubernetes struct, without the YAML → JSON → reflection round
// trip of the strict path, which costs about 100 µs per object.
//
// Its contract: for every document it accepts, the entries decodeDoc
// returns are exactly those the strict path returns (checked by
// TestFastMatchesStrict and FuzzDecode). It accepts a document only when
// it is sure: every key is a known field of the expected type, no key is
// repeated, every scalar resolves (under YAML 1.1, as sigs.k8s.io/yaml
// does) unambiguously to the type the field wants. Anything else —
// anchors, tags, block scalars, multi-line scalars, nulls, unknown or
// mistyped fields, Lists, Nodes — makes it give up, and the strict path
// decodes the document and words any Problem as before.

// ynode is a parsed YAML value: a mapping, a sequence or a scalar.
type ynode struct {
	kind   byte // 'm' mapping, 's' sequence, 'v' scalar
	quoted bool // scalar was quoted: always a string
	val    string
	keys   []string // mapping keys, in order (no duplicates)
	vals   []*ynode // mapping values, parallel to keys
	items  []*ynode // sequence items
}

// yline is one meaningful line of a document: indentation, then the text
// without the comment and trailing blanks.
type yline struct {
	indent int
	text   string
}

// yparser parses documents one at a time. Its nodes and lines are reused
// by the next document, so a node is valid only until then.
type yparser struct {
	lines []yline
	pos   int
	nodes []ynode
	used  int
	// strs interns the strings detach copies out of the file.
	strs map[string]string
}

// reset makes every node and line free for the next document.
func (p *yparser) reset() {
	p.lines, p.pos, p.used = p.lines[:0], 0, 0
}

func (p *yparser) node(kind byte) *ynode {
	if p.used == len(p.nodes) {
		// Grow by a fresh block; earlier nodes stay where they are since
		// parents point at them.
		p.nodes = make([]ynode, max(64, 2*len(p.nodes)))
		p.used = 0
	}
	n := &p.nodes[p.used]
	p.used++
	*n = ynode{kind: kind, keys: n.keys[:0], vals: n.vals[:0], items: n.items[:0]}
	return n
}

// parse parses doc, reporting false when it is not in the subset the
// fast path handles. The strings of the nodes are substrings of doc.
func (p *yparser) parse(doc string) (*ynode, bool) {
	p.reset()
	for i := 0; i < len(doc); i++ {
		if c := doc[i]; c >= 0x7f || (c < ' ' && c != '\n' && c != '\r' && c != '\t') {
			return nil, false // non-ASCII or control: the strict path words it
		}
	}
	if t := strings.TrimSpace(doc); len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		// JSON (or flow YAML) spanning lines: parse the whole text as flow.
		if strings.IndexByte(t, '#') >= 0 {
			return nil, false
		}
		n, rest, ok := p.flow(t)
		if !ok || trimLeft(rest) != "" {
			return nil, false
		}
		return n, true
	}
	for len(doc) > 0 {
		var line string
		if i := strings.IndexByte(doc, '\n'); i >= 0 {
			line, doc = doc[:i], doc[i+1:]
		} else {
			line, doc = doc, ""
		}
		ind := 0
		for ind < len(line) && line[ind] == ' ' {
			ind++
		}
		text, ok := stripComment(line[ind:])
		if !ok {
			return nil, false
		}
		if text == "" {
			continue
		}
		switch text[0] {
		case '\t', '%':
			return nil, false
		}
		if len(text) >= 3 && (text[:3] == "---" || text[:3] == "...") {
			return nil, false
		}
		p.lines = append(p.lines, yline{ind, text})
	}
	if len(p.lines) == 0 || p.lines[0].indent != 0 {
		return nil, false
	}
	n, ok := p.block(0)
	if !ok || p.pos != len(p.lines) {
		return nil, false
	}
	return n, true
}

// stripComment removes a trailing comment and blanks, tracking quotes. It
// reports false for text it will not handle (tabs, carriage returns
// inside, unterminated quotes).
func stripComment(b string) (string, bool) {
	end := len(b)
	var q byte
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case q == '\'':
			if c == '\'' {
				if i+1 < len(b) && b[i+1] == '\'' {
					i++
				} else {
					q = 0
				}
			}
		case q == '"':
			if c == '\\' {
				i++
			} else if c == '"' {
				q = 0
			}
		case c == '\'' || c == '"':
			q = c
		case c == '#' && (i == 0 || b[i-1] == ' '):
			end = i
			i = len(b)
		case c == '\t':
			return "", false
		}
	}
	if q != 0 && end == len(b) {
		return "", false
	}
	for end > 0 && (b[end-1] == ' ' || b[end-1] == '\r') {
		end--
	}
	for i := 0; i < end; i++ {
		if b[i] == '\r' {
			return "", false
		}
	}
	return b[:end], true
}

// block parses the block node whose first line is at p.pos and is indented
// at least min.
func (p *yparser) block(min int) (*ynode, bool) {
	if p.pos >= len(p.lines) || p.lines[p.pos].indent < min {
		return nil, false
	}
	l := p.lines[p.pos]
	if isSeqItem(l.text) {
		return p.seq(l.indent)
	}
	return p.mapping(l.indent)
}

func isSeqItem(s string) bool { return s == "-" || (len(s) > 1 && s[0] == '-' && s[1] == ' ') }

// mapping parses a block mapping at indentation ind.
func (p *yparser) mapping(ind int) (*ynode, bool) {
	m := p.node('m')
	for p.pos < len(p.lines) {
		l := p.lines[p.pos]
		if l.indent < ind {
			break
		}
		if l.indent > ind || isSeqItem(l.text) {
			return nil, false
		}
		key, rest, ok := splitKey(l.text)
		if !ok {
			return nil, false
		}
		for _, k := range m.keys {
			if k == key {
				return nil, false // duplicate: the strict path words it
			}
		}
		p.pos++
		var v *ynode
		if rest == "" {
			if p.pos >= len(p.lines) {
				return nil, false // null
			}
			next := p.lines[p.pos]
			switch {
			case next.indent > ind:
				v, ok = p.block(ind + 1)
			case next.indent == ind && isSeqItem(next.text):
				v, ok = p.seq(ind)
			default:
				return nil, false // null
			}
		} else {
			v, ok = p.inline(rest, ind)
		}
		if !ok {
			return nil, false
		}
		m.keys = append(m.keys, key)
		m.vals = append(m.vals, v)
	}
	return m, true
}

// seq parses a block sequence whose "-" are at indentation ind.
func (p *yparser) seq(ind int) (*ynode, bool) {
	s := p.node('s')
	for p.pos < len(p.lines) {
		l := p.lines[p.pos]
		if l.indent < ind || (l.indent == ind && !isSeqItem(l.text)) {
			break
		}
		if l.indent > ind {
			return nil, false
		}
		var item *ynode
		var ok bool
		if l.text == "-" {
			p.pos++
			item, ok = p.block(ind + 1)
		} else {
			rest := l.text[2:]
			off := 2
			for len(rest) > 0 && rest[0] == ' ' {
				rest, off = rest[1:], off+1
			}
			if _, _, isKey := splitKey(rest); isKey || isSeqItem(rest) {
				// "- key: v" or "- - x": the item is a block node that
				// starts on this line, indented past the dash.
				p.lines[p.pos] = yline{ind + off, rest}
				item, ok = p.block(ind + off)
			} else {
				p.pos++
				item, ok = p.inline(rest, ind)
			}
		}
		if !ok {
			return nil, false
		}
		s.items = append(s.items, item)
	}
	return s, true
}

// inline parses a value that sits on its line after "key: " or "- ": a
// single-line flow collection or a scalar. The next line must not continue
// it.
func (p *yparser) inline(s string, ind int) (*ynode, bool) {
	if p.pos < len(p.lines) && p.lines[p.pos].indent > ind {
		return nil, false // multi-line scalar or flow collection
	}
	var n *ynode
	var rest string
	var ok bool
	switch s[0] {
	case '{', '[':
		n, rest, ok = p.flow(s)
	case '\'', '"':
		n = p.node('v')
		n.quoted = true
		n.val, rest, ok = quoted(s)
	default:
		if !plainOK(s, false) {
			return nil, false
		}
		n = p.node('v')
		n.val, ok = s, true
	}
	if !ok || rest != "" {
		return nil, false
	}
	return n, true
}

// plainOK reports whether s can be taken as one plain scalar. In flow
// context the flow indicators end it, so callers pass only the scalar.
func plainOK(s string, flow bool) bool {
	if s == "" {
		return false
	}
	switch s[0] {
	case '-', '?', ':', ',', '[', ']', '{', '}', '#', '&', '*', '!', '|', '>', '\'', '"', '%', '@', '`', ' ':
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case flow && (c == ':' || c == ' ' || c == ',' || c == '[' || c == ']' || c == '{' || c == '}'):
			return false
		case c == ':' && (i+1 == len(s) || s[i+1] == ' '):
			return false
		case c == '#' && s[i-1] == ' ':
			return false
		}
	}
	return true
}

// splitKey splits "key: rest" (or "key:") into the key and the trimmed
// rest. Keys are quoted, or plain names that YAML 1.1 resolves to a string.
func splitKey(s string) (key, rest string, ok bool) {
	if s == "" {
		return "", "", false
	}
	if s[0] == '"' || s[0] == '\'' {
		k, r, ok := quoted(s)
		if !ok || r == "" || r[0] != ':' || (len(r) > 1 && r[1] != ' ') {
			return "", "", false
		}
		return k, trimLeft(r[1:]), true
	}
	i := 0
	for ; i < len(s); i++ {
		if s[i] == ':' && (i+1 == len(s) || s[i+1] == ' ') {
			break
		}
		if !keyChar(s[i]) {
			return "", "", false
		}
	}
	if i == 0 || i == len(s) || !isLetter(s[0]) || special(s[:i]) {
		return "", "", false
	}
	return s[:i], trimLeft(s[i+1:]), true
}

func keyChar(c byte) bool {
	return isLetter(c) || (c >= '0' && c <= '9') || c == '.' || c == '/' || c == '-' || c == '_'
}

func isLetter(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }

func trimLeft(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\n' || s[0] == '\r' || s[0] == '\t') {
		s = s[1:]
	}
	return s
}

// special reports whether YAML 1.1 resolves the plain scalar s to
// something other than a string or an int the fast path understands
// (bools other than true/false, nulls, and similar): the fast path then
// gives up.
func special(s string) bool {
	switch len(s) {
	case 1, 2, 3, 4, 5:
	default:
		return false
	}
	switch s {
	case "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO",
		"on", "On", "ON", "off", "Off", "OFF",
		"true", "True", "TRUE", "false", "False", "FALSE",
		"null", "Null", "NULL", "~":
		return true
	}
	return false
}

// quoted parses a quoted scalar at the start of s and returns its value
// and the rest of s. Escapes other than \" \\ \/ are not handled.
func quoted(s string) (val, rest string, ok bool) {
	q := s[0]
	var b []byte
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == q && q == '\'' && i+1 < len(s) && s[i+1] == '\'':
			if b == nil {
				b = append([]byte{}, s[1:i]...)
			}
			b = append(b, '\'')
			i++
		case c == q:
			if b == nil {
				return s[1:i], s[i+1:], true
			}
			return string(b), s[i+1:], true
		case c == '\\' && q == '"':
			if i+1 == len(s) {
				return "", "", false
			}
			switch e := s[i+1]; e {
			case '"', '\\', '/':
				if b == nil {
					b = append([]byte{}, s[1:i]...)
				}
				b = append(b, e)
				i++
			default:
				return "", "", false
			}
		default:
			if b != nil {
				b = append(b, c)
			}
		}
	}
	return "", "", false
}

// flow parses a flow collection or scalar at the start of s (JSON is one)
// and returns the rest.
func (p *yparser) flow(s string) (*ynode, string, bool) {
	s = trimLeft(s)
	if s == "" {
		return nil, "", false
	}
	switch s[0] {
	case '{':
		m := p.node('m')
		s = trimLeft(s[1:])
		if s != "" && s[0] == '}' {
			return m, s[1:], true
		}
		for {
			var k string
			var ok bool
			if s != "" && (s[0] == '"' || s[0] == '\'') {
				if k, s, ok = quoted(s); !ok {
					return nil, "", false
				}
			} else {
				i := 0
				for i < len(s) && keyChar(s[i]) {
					i++
				}
				k, s = s[:i], s[i:]
				if k == "" || !isLetter(k[0]) || special(k) || len(s) < 2 || s[0] != ':' || s[1] != ' ' {
					return nil, "", false
				}
			}
			s = trimLeft(s)
			if s == "" || s[0] != ':' {
				return nil, "", false
			}
			for _, old := range m.keys {
				if old == k {
					return nil, "", false
				}
			}
			v, rest, ok := p.flow(s[1:])
			if !ok {
				return nil, "", false
			}
			m.keys = append(m.keys, k)
			m.vals = append(m.vals, v)
			s = trimLeft(rest)
			if s == "" {
				return nil, "", false
			}
			if s[0] == '}' {
				return m, s[1:], true
			}
			if s[0] != ',' {
				return nil, "", false
			}
			s = trimLeft(s[1:])
		}
	case '[':
		q := p.node('s')
		s = trimLeft(s[1:])
		if s != "" && s[0] == ']' {
			return q, s[1:], true
		}
		for {
			v, rest, ok := p.flow(s)
			if !ok {
				return nil, "", false
			}
			q.items = append(q.items, v)
			s = trimLeft(rest)
			if s == "" {
				return nil, "", false
			}
			if s[0] == ']' {
				return q, s[1:], true
			}
			if s[0] != ',' {
				return nil, "", false
			}
			s = trimLeft(s[1:])
		}
	case '"', '\'':
		n := p.node('v')
		n.quoted = true
		var ok bool
		n.val, s, ok = quoted(s)
		return n, s, ok
	default:
		i := 0
		for i < len(s) && s[i] != ',' && s[i] != ']' && s[i] != '}' && s[i] != '\n' && s[i] != '\r' {
			i++
		}
		v := s[:i]
		for v != "" && v[len(v)-1] == ' ' {
			v = v[:len(v)-1]
		}
		if !plainOK(v, true) {
			return nil, "", false
		}
		n := p.node('v')
		n.val = v
		return n, s[i:], true
	}
}

// Typed access. Each reports false when the node is not exactly of the
// type the field wants, as the strict JSON decoder would see it.

// str is a scalar that YAML 1.1 resolves to a string.
func (n *ynode) str() (string, bool) {
	if n.kind != 'v' {
		return "", false
	}
	if n.quoted {
		return n.val, true
	}
	s := n.val
	if special(s) {
		return "", false
	}
	c := s[0]
	if isLetter(c) || c == '/' {
		return s, true
	}
	// Digits: only dotted forms with two or more dots (IPv4 addresses and
	// CIDRs) are sure to stay strings (not ints, floats or timestamps).
	if c >= '0' && c <= '9' {
		dots := 0
		for i := 0; i < len(s); i++ {
			switch {
			case s[i] == '.':
				dots++
			case s[i] >= '0' && s[i] <= '9', s[i] == '/':
			default:
				return "", false
			}
		}
		return s, dots >= 2
	}
	return "", false
}

// i32 is a plain decimal integer in the int32 range.
func (n *ynode) i32() (int32, bool) {
	if n.kind != 'v' || n.quoted || len(n.val) > 9 {
		return 0, false
	}
	s := n.val
	if s != "0" && s[0] == '0' {
		return 0, false
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		return 0, false
	}
	return int32(v), true
}

// boolean is a plain true or false.
func (n *ynode) boolean() (bool, bool) {
	if n.kind != 'v' || n.quoted {
		return false, false
	}
	switch n.val {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

func (n *ynode) strs() ([]string, bool) {
	if n.kind != 's' {
		return nil, false
	}
	out := make([]string, len(n.items))
	for i, it := range n.items {
		var ok bool
		if out[i], ok = it.str(); !ok {
			return nil, false
		}
	}
	return out, true
}

func (n *ynode) strMap() (map[string]string, bool) {
	if n.kind != 'm' {
		return nil, false
	}
	out := make(map[string]string, len(n.keys))
	for i, k := range n.keys {
		v, ok := n.vals[i].str()
		if !ok {
			return nil, false
		}
		out[k] = v
	}
	return out, true
}

// each calls f for every key of a mapping and reports false when n is
// not a mapping or f reports false.
func (n *ynode) each(f func(k string, v *ynode) bool) bool {
	if n.kind != 'm' {
		return false
	}
	for i, k := range n.keys {
		if !f(k, n.vals[i]) {
			return false
		}
	}
	return true
}

func (n *ynode) eachItem(f func(v *ynode) bool) bool {
	if n.kind != 's' {
		return false
	}
	for _, it := range n.items {
		if !f(it) {
			return false
		}
	}
	return true
}

func setStr(dst *string) func(*ynode) bool {
	return func(n *ynode) bool {
		var ok bool
		*dst, ok = n.str()
		return ok
	}
}

func strPtr(n *ynode) (*string, bool) {
	s, ok := n.str()
	return &s, ok
}

// fastHeader reads apiVersion, kind and metadata.name/namespace.
func fastHeader(root *ynode) (h header, meta *ynode, ok bool) {
	if root.kind != 'm' {
		return h, nil, false
	}
	ok = root.each(func(k string, v *ynode) bool {
		switch k {
		case "apiVersion":
			return setStr(&h.APIVersion)(v)
		case "kind":
			return setStr(&h.Kind)(v)
		case "metadata":
			meta = v
			return v.kind == 'm'
		}
		return true
	})
	if !ok || meta == nil {
		return h, nil, false
	}
	ok = meta.each(func(k string, v *ynode) bool {
		switch k {
		case "name":
			return setStr(&h.Metadata.Name)(v)
		case "namespace":
			return setStr(&h.Metadata.Namespace)(v)
		}
		return true
	})
	return h, meta, ok
}

// fastMeta fills the ObjectMeta fields the fast path knows.
func fastMeta(meta *ynode, om *metav1.ObjectMeta) bool {
	return meta.each(func(k string, v *ynode) bool {
		var ok bool
		switch k {
		case "name":
			om.Name, ok = v.str()
		case "namespace":
			om.Namespace, ok = v.str()
		case "labels":
			om.Labels, ok = v.strMap()
		case "annotations":
			om.Annotations, ok = v.strMap()
		}
		return ok
	})
}

// fastService decodes a v1 Service document (header already checked).
func fastService(root *ynode) (*corev1.Service, bool) {
	svc := &corev1.Service{}
	ok := root.each(func(k string, v *ynode) bool {
		switch k {
		case "apiVersion", "kind":
			return true
		case "metadata":
			return fastMeta(v, &svc.ObjectMeta)
		case "spec":
			return fastServiceSpec(v, &svc.Spec)
		case "status":
			return v.each(func(k string, v *ynode) bool {
				if k != "loadBalancer" {
					return false
				}
				return v.each(func(k string, v *ynode) bool {
					if k != "ingress" {
						return false
					}
					svc.Status.LoadBalancer.Ingress = make([]corev1.LoadBalancerIngress, 0, len(v.items))
					return v.eachItem(func(v *ynode) bool {
						var ing corev1.LoadBalancerIngress
						ok := v.each(func(k string, v *ynode) bool {
							switch k {
							case "ip":
								return setStr(&ing.IP)(v)
							case "hostname":
								return setStr(&ing.Hostname)(v)
							case "ipMode":
								s, ok := v.str()
								m := corev1.LoadBalancerIPMode(s)
								ing.IPMode = &m
								return ok
							}
							return false
						})
						svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, ing)
						return ok
					})
				})
			})
		}
		return false
	})
	return svc, ok
}

func fastServiceSpec(n *ynode, spec *corev1.ServiceSpec) bool {
	return n.each(func(k string, v *ynode) bool {
		var ok bool
		var s string
		switch k {
		case "type":
			s, ok = v.str()
			spec.Type = corev1.ServiceType(s)
		case "clusterIP":
			spec.ClusterIP, ok = v.str()
		case "clusterIPs":
			spec.ClusterIPs, ok = v.strs()
		case "externalIPs":
			spec.ExternalIPs, ok = v.strs()
		case "loadBalancerSourceRanges":
			spec.LoadBalancerSourceRanges, ok = v.strs()
		case "loadBalancerIP":
			spec.LoadBalancerIP, ok = v.str()
		case "externalName":
			spec.ExternalName, ok = v.str()
		case "selector":
			spec.Selector, ok = v.strMap()
		case "sessionAffinity":
			s, ok = v.str()
			spec.SessionAffinity = corev1.ServiceAffinity(s)
		case "externalTrafficPolicy":
			s, ok = v.str()
			spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicy(s)
		case "internalTrafficPolicy":
			s, ok = v.str()
			p := corev1.ServiceInternalTrafficPolicy(s)
			spec.InternalTrafficPolicy = &p
		case "ipFamilyPolicy":
			s, ok = v.str()
			p := corev1.IPFamilyPolicy(s)
			spec.IPFamilyPolicy = &p
		case "trafficDistribution":
			spec.TrafficDistribution, ok = strPtr(v)
		case "healthCheckNodePort":
			spec.HealthCheckNodePort, ok = v.i32()
		case "publishNotReadyAddresses":
			spec.PublishNotReadyAddresses, ok = v.boolean()
		case "ipFamilies":
			var fs []string
			if fs, ok = v.strs(); ok {
				spec.IPFamilies = make([]corev1.IPFamily, len(fs))
				for i, f := range fs {
					spec.IPFamilies[i] = corev1.IPFamily(f)
				}
			}
		case "sessionAffinityConfig":
			cfg := &corev1.SessionAffinityConfig{}
			spec.SessionAffinityConfig = cfg
			ok = v.each(func(k string, v *ynode) bool {
				if k != "clientIP" {
					return false
				}
				cfg.ClientIP = &corev1.ClientIPConfig{}
				return v.each(func(k string, v *ynode) bool {
					if k != "timeoutSeconds" {
						return false
					}
					t, ok := v.i32()
					cfg.ClientIP.TimeoutSeconds = &t
					return ok
				})
			})
		case "ports":
			spec.Ports = make([]corev1.ServicePort, 0, len(v.items))
			ok = v.eachItem(func(v *ynode) bool {
				var sp corev1.ServicePort
				ok := v.each(func(k string, v *ynode) bool {
					var ok bool
					switch k {
					case "name":
						sp.Name, ok = v.str()
					case "protocol":
						var s string
						s, ok = v.str()
						sp.Protocol = corev1.Protocol(s)
					case "port":
						sp.Port, ok = v.i32()
					case "nodePort":
						sp.NodePort, ok = v.i32()
					case "appProtocol":
						sp.AppProtocol, ok = strPtr(v)
					case "targetPort":
						if i, isInt := v.i32(); isInt {
							sp.TargetPort, ok = intstr.FromInt32(i), true
						} else if s, isStr := v.str(); isStr {
							sp.TargetPort, ok = intstr.FromString(s), true
						}
					}
					return ok
				})
				spec.Ports = append(spec.Ports, sp)
				return ok
			})
		}
		return ok
	})
}

// fastSlice decodes a discovery.k8s.io/v1 EndpointSlice document.
func fastSlice(root *ynode) (*discoveryv1.EndpointSlice, bool) {
	es := &discoveryv1.EndpointSlice{}
	ok := root.each(func(k string, v *ynode) bool {
		var ok bool
		switch k {
		case "apiVersion", "kind":
			return true
		case "metadata":
			return fastMeta(v, &es.ObjectMeta)
		case "addressType":
			var s string
			s, ok = v.str()
			es.AddressType = discoveryv1.AddressType(s)
		case "ports":
			es.Ports = make([]discoveryv1.EndpointPort, 0, len(v.items))
			ok = v.eachItem(func(v *ynode) bool {
				var ep discoveryv1.EndpointPort
				ok := v.each(func(k string, v *ynode) bool {
					var ok bool
					switch k {
					case "name":
						ep.Name, ok = strPtr(v)
					case "protocol":
						var s string
						s, ok = v.str()
						p := corev1.Protocol(s)
						ep.Protocol = &p
					case "port":
						var i int32
						i, ok = v.i32()
						ep.Port = &i
					case "appProtocol":
						ep.AppProtocol, ok = strPtr(v)
					}
					return ok
				})
				es.Ports = append(es.Ports, ep)
				return ok
			})
		case "endpoints":
			es.Endpoints = make([]discoveryv1.Endpoint, 0, len(v.items))
			ok = v.eachItem(func(v *ynode) bool {
				var ep discoveryv1.Endpoint
				ok := v.each(func(k string, v *ynode) bool {
					var ok bool
					switch k {
					case "addresses":
						ep.Addresses, ok = v.strs()
					case "nodeName":
						ep.NodeName, ok = strPtr(v)
					case "zone":
						ep.Zone, ok = strPtr(v)
					case "hostname":
						ep.Hostname, ok = strPtr(v)
					case "conditions":
						ok = v.each(func(k string, v *ynode) bool {
							b, ok := v.boolean()
							switch k {
							case "ready":
								ep.Conditions.Ready = &b
							case "serving":
								ep.Conditions.Serving = &b
							case "terminating":
								ep.Conditions.Terminating = &b
							default:
								return false
							}
							return ok
						})
					case "hints":
						h := &discoveryv1.EndpointHints{}
						ep.Hints = h
						ok = v.each(func(k string, v *ynode) bool {
							var ok bool
							switch k {
							case "forZones":
								h.ForZones = make([]discoveryv1.ForZone, 0, len(v.items))
								ok = v.eachItem(func(v *ynode) bool {
									var z discoveryv1.ForZone
									ok := v.each(func(k string, v *ynode) bool {
										return k == "name" && setStr(&z.Name)(v)
									})
									h.ForZones = append(h.ForZones, z)
									return ok
								})
							case "forNodes":
								h.ForNodes = make([]discoveryv1.ForNode, 0, len(v.items))
								ok = v.eachItem(func(v *ynode) bool {
									var z discoveryv1.ForNode
									ok := v.each(func(k string, v *ynode) bool {
										return k == "name" && setStr(&z.Name)(v)
									})
									h.ForNodes = append(h.ForNodes, z)
									return ok
								})
							}
							return ok
						})
					}
					return ok
				})
				es.Endpoints = append(es.Endpoints, ep)
				return ok
			})
		}
		return ok
	})
	return es, ok
}

// intern returns a copy of s that does not share memory with the file,
// the same copy for equal strings of one file.
func (p *yparser) intern(s string) string {
	if s == "" {
		return ""
	}
	if c, ok := p.strs[s]; ok {
		return c
	}
	if p.strs == nil {
		p.strs = map[string]string{}
	}
	c := strings.Clone(s)
	p.strs[c] = c
	return c
}

// detach replaces every string of e that may point into the file by an
// interned copy, so the file's bytes are not kept alive by the objects.
// TestSnapshotsEqualCoversModel fails when a model type gains a field,
// to have it added here too.
func (p *yparser) detach(e *entry) {
	in := p.intern
	e.key = objKey{Kind: in(e.key.Kind), Namespace: in(e.key.Namespace), Name: in(e.key.Name)}
	if svc := e.svc; svc != nil {
		svc.Namespace, svc.Name = in(svc.Namespace), in(svc.Name)
		svc.Type = model.ServiceType(in(string(svc.Type)))
		svc.IPFamilyPolicy = in(svc.IPFamilyPolicy)
		svc.ExternalTrafficPolicy = model.TrafficPolicy(in(string(svc.ExternalTrafficPolicy)))
		svc.InternalTrafficPolicy = model.TrafficPolicy(in(string(svc.InternalTrafficPolicy)))
		svc.TrafficDistribution = in(svc.TrafficDistribution)
		for i := range svc.IPFamilies {
			svc.IPFamilies[i] = model.AddressType(in(string(svc.IPFamilies[i])))
		}
		for i := range svc.Ports {
			pt := &svc.Ports[i]
			pt.Name, pt.Protocol = in(pt.Name), model.Protocol(in(string(pt.Protocol)))
		}
	}
	if sl := e.slice; sl != nil {
		sl.Name = in(sl.Name)
		sl.Service = model.ServiceName{Namespace: in(sl.Service.Namespace), Name: in(sl.Service.Name)}
		sl.AddressType = model.AddressType(in(string(sl.AddressType)))
		for i := range sl.Ports {
			pt := &sl.Ports[i]
			pt.Name, pt.Protocol = in(pt.Name), model.Protocol(in(string(pt.Protocol)))
		}
		for i := range sl.Endpoints {
			ep := &sl.Endpoints[i]
			ep.NodeName, ep.Zone = in(ep.NodeName), in(ep.Zone)
			for j := range ep.ZoneHints {
				ep.ZoneHints[j] = in(ep.ZoneHints[j])
			}
			for j := range ep.NodeHints {
				ep.NodeHints[j] = in(ep.NodeHints[j])
			}
		}
	}
	for i := range e.problems {
		pr := &e.problems[i]
		pr.Object, pr.Field, pr.Value, pr.Reason = in(pr.Object), in(pr.Field), in(pr.Value), in(pr.Reason)
	}
}
