package fastyaml

// The YAML subset parser: block and single-line flow
// mappings and sequences, plain and quoted scalars, comments; anything else
// (anchors, tags, block or multi-line scalars) is refused, and the strict
// path decodes the document.

import (
	"strings"
)

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
	if t := strings.TrimSpace(doc); len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		// JSON (or flow YAML) spanning lines: parse the whole text as flow.
		if !printable(doc) || strings.IndexByte(t, '#') >= 0 {
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
		text := line[ind:]
		if plainLine(text) {
			// Nothing to strip but trailing blanks (most lines).
			end := len(text)
			for end > 0 && text[end-1] == ' ' {
				end--
			}
			text = text[:end]
		} else {
			if !printable(text) {
				return nil, false // non-ASCII or control: the strict path words it
			}
			var ok bool
			if text, ok = stripComment(text); !ok {
				return nil, false
			}
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

// lineSpecial marks the bytes a line is looked at closely for: quotes and '#'
// (stripComment), and control characters and non-ASCII (refused, as are
// tabs and carriage returns where stripComment meets them).
var lineSpecial = func() (t [256]bool) {
	for c := range t {
		t[c] = c >= 0x7f || c < ' ' || c == '\'' || c == '"' || c == '#'
	}
	return t
}()

// plainLine reports whether line holds no special byte: then it has no
// comment, no quote and nothing to refuse.
func plainLine(line string) bool {
	for i := 0; i < len(line); i++ {
		if lineSpecial[line[i]] {
			return false
		}
	}
	return true
}

// printable reports whether s holds only ASCII that is not a control
// character other than newline, carriage return and tab.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 0x7f || (c < ' ' && c != '\n' && c != '\r' && c != '\t') {
			return false
		}
	}
	return true
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
