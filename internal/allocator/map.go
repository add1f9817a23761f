package allocator

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Record is what one Service owns.
type Record struct {
	// ClusterIPs, primary family first.
	ClusterIPs []netip.Addr `json:"clusterIPs,omitempty"`
	// NodePorts of the Service's ports, in spec order.
	NodePorts []PortAssignment `json:"nodePorts,omitempty"`
	// HealthCheckNodePort, 0 when none.
	HealthCheckNodePort uint16 `json:"healthCheckNodePort,omitempty"`
}

// PortAssignment is the NodePort of one Service port.
type PortAssignment struct {
	Name     string         `json:"name,omitempty"`
	Protocol model.Protocol `json:"protocol"`
	NodePort uint16         `json:"nodePort"`
}

// Ports returns every port the record holds (NodePorts and the health
// check port), each once.
func (r Record) Ports() []uint16 {
	var out []uint16
	for _, p := range r.NodePorts {
		if p.NodePort != 0 && !slices.Contains(out, p.NodePort) {
			out = append(out, p.NodePort)
		}
	}
	if r.HealthCheckNodePort != 0 && !slices.Contains(out, r.HealthCheckNodePort) {
		out = append(out, r.HealthCheckNodePort)
	}
	return out
}

// IsZero reports whether the record holds nothing.
func (r Record) IsZero() bool {
	return len(r.ClusterIPs) == 0 && len(r.NodePorts) == 0 && r.HealthCheckNodePort == 0
}

func (r Record) clone() Record {
	r.ClusterIPs = slices.Clone(r.ClusterIPs)
	r.NodePorts = slices.Clone(r.NodePorts)
	return r
}

func (r Record) equal(o Record) bool {
	return slices.Equal(r.ClusterIPs, o.ClusterIPs) && slices.Equal(r.NodePorts, o.NodePorts) &&
		r.HealthCheckNodePort == o.HealthCheckNodePort
}

func encodeRecord(r Record) ([]byte, error) { return appendRecord(nil, r) }

// appendRecord appends r's JSON encoding, byte for byte what json.Marshal
// writes, to b. It writes records of plain strings itself and hands any
// other to json.Marshal: at 50,000 Services the reflection was 40 ms of a
// cold start's allocation map write.
func appendRecord(b []byte, r Record) ([]byte, error) {
	if !r.plain() {
		j, err := json.Marshal(r)
		return append(b, j...), err
	}
	start := len(b)
	b = append(b, '{')
	if len(r.ClusterIPs) > 0 {
		b = append(b, `"clusterIPs":[`...)
		for i, ip := range r.ClusterIPs {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			if ip.IsValid() {
				b = ip.AppendTo(b)
			}
			b = append(b, '"')
		}
		b = append(b, ']')
	}
	if len(r.NodePorts) > 0 {
		if len(b) > start+1 {
			b = append(b, ',')
		}
		b = append(b, `"nodePorts":[`...)
		for i, p := range r.NodePorts {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '{')
			if p.Name != "" {
				b = append(append(append(b, `"name":"`...), p.Name...), `",`...)
			}
			b = append(append(append(b, `"protocol":"`...), p.Protocol...), `","nodePort":`...)
			b = strconv.AppendUint(b, uint64(p.NodePort), 10)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if r.HealthCheckNodePort != 0 {
		if len(b) > start+1 {
			b = append(b, ',')
		}
		b = append(b, `"healthCheckNodePort":`...)
		b = strconv.AppendUint(b, uint64(r.HealthCheckNodePort), 10)
	}
	return append(b, '}'), nil
}

// plain reports whether every string of r is written by json.Marshal as
// it is: no address has a zone, and names and protocols hold printable
// ASCII only, without the quote, the backslash or the HTML-escaped <, >
// and &.
func (r Record) plain() bool {
	for _, ip := range r.ClusterIPs {
		if ip.Zone() != "" {
			return false
		}
	}
	for _, p := range r.NodePorts {
		if !plainString(p.Name) || !plainString(string(p.Protocol)) {
			return false
		}
	}
	return true
}

func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

func decodeRecord(b []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("allocator: decode record: %w", err)
	}
	return r, nil
}

// serviceKey is the store key of a Service: "namespace/name".
func serviceKey(n model.ServiceName) string { return string(appendServiceKey(nil, n)) }

// appendServiceKey appends n's store key to b.
func appendServiceKey(b []byte, n model.ServiceName) []byte {
	return append(append(append(b, n.Namespace...), '/'), n.Name...)
}

func parseServiceKey(k string) (model.ServiceName, error) {
	ns, name, ok := strings.Cut(k, "/")
	if !ok || ns == "" || name == "" {
		return model.ServiceName{}, fmt.Errorf("allocator: bad service key %q", k)
	}
	return model.ServiceName{Namespace: ns, Name: name}, nil
}

// Map is a revisioned snapshot of the allocation map: which Service owns
// which ClusterIPs and NodePorts. Inside Store.Update it also collects
// changes (Set, Delete), which the store commits atomically.
//
// A Map is not safe for concurrent use. Records returned by Get and Range
// share memory with the store: do not modify their slices.
type Map struct {
	rev     int64
	base    map[model.ServiceName]Record
	changes map[model.ServiceName]*Record // nil value: deleted
	// onCommit, set by an Update fn, is called by the store (under its
	// lock) with the new revision once that fn's changes are committed.
	onCommit func(rev int64)
	// shared says base is also another Map's (see snapshot): it is
	// copied before it is changed.
	shared bool
}

func newMap(rev int64, base map[model.ServiceName]Record) *Map {
	if base == nil {
		base = map[model.ServiceName]Record{}
	}
	return &Map{rev: rev, base: base, changes: map[model.ServiceName]*Record{}}
}

// Revision is the revision of the map this snapshot was read at; every
// committed change increases it. 0 means the map was never written.
func (m *Map) Revision() int64 { return m.rev }

// Get returns the record of svc.
func (m *Map) Get(svc model.ServiceName) (Record, bool) {
	if c, ok := m.changes[svc]; ok {
		if c == nil {
			return Record{}, false
		}
		return *c, true
	}
	r, ok := m.base[svc]
	return r, ok
}

// Set replaces the record of svc (a zero record deletes it).
func (m *Map) Set(svc model.ServiceName, r Record) {
	if r.IsZero() {
		m.Delete(svc)
		return
	}
	if old, ok := m.base[svc]; ok && old.equal(r) {
		delete(m.changes, svc)
		return
	}
	r = r.clone()
	m.changes[svc] = &r
}

// Delete removes the record of svc; deleting an absent one is a no-op.
func (m *Map) Delete(svc model.ServiceName) {
	if _, ok := m.base[svc]; ok {
		m.changes[svc] = nil
	} else {
		delete(m.changes, svc)
	}
}

// Range calls fn for every record, in no particular order, until fn
// returns false.
func (m *Map) Range(fn func(model.ServiceName, Record) bool) {
	for n, r := range m.base {
		if _, changed := m.changes[n]; changed {
			continue
		}
		if !fn(n, r) {
			return
		}
	}
	for n, r := range m.changes {
		if r != nil && !fn(n, *r) {
			return
		}
	}
}

// Names returns every Service with a record, sorted.
func (m *Map) Names() []model.ServiceName {
	var out []model.ServiceName
	m.Range(func(n model.ServiceName, _ Record) bool {
		out = append(out, n)
		return true
	})
	slices.SortFunc(out, compareNames)
	return out
}

// Len returns the number of records.
func (m *Map) Len() int {
	n := 0
	m.Range(func(model.ServiceName, Record) bool { n++; return true })
	return n
}

// dirty reports whether Set or Delete changed anything.
func (m *Map) dirty() bool { return len(m.changes) > 0 }

// apply folds the changes into base (in place, unless it is shared) and
// sets the revision.
func (m *Map) apply(rev int64) {
	if len(m.changes) > 0 {
		m.own(len(m.changes))
	}
	for n, r := range m.changes {
		if r == nil {
			delete(m.base, n)
		} else {
			m.base[n] = *r
		}
	}
	if len(m.changes) > 1024 {
		// A map keeps its buckets when cleared: after a cold start's
		// 10,000s of Services they would stay allocated (1.6 MB at
		// 10,000) for the few changes that follow.
		m.changes = map[model.ServiceName]*Record{}
	} else {
		clear(m.changes)
	}
	m.rev = rev
	if f := m.onCommit; f != nil {
		m.onCommit = nil
		f(rev)
	}
}

// begin readies the map for an Update attempt.
func (m *Map) begin() {
	clear(m.changes)
	m.onCommit = nil
}

// snapshot returns a detached snapshot of the committed records. It
// copies nothing: both maps take the records (base) as shared, and
// whichever changes them first copies them then (own). A store's map is
// snapshot once a minute by the repair pass and rarely changed, so most
// passes copy nothing, where a copy per pass was 6 MB of garbage at
// 50,000 Services. m has no pending changes (a store's map between
// Updates); if it has, they are folded into a copy.
func (m *Map) snapshot() *Map {
	if len(m.changes) > 0 {
		c := newMap(m.rev, maps.Clone(m.base))
		for n, r := range m.changes {
			if r == nil {
				delete(c.base, n)
			} else {
				c.base[n] = *r
			}
		}
		return c
	}
	m.shared = true
	c := newMap(m.rev, m.base)
	c.shared = true
	return c
}

// own makes base m's alone before it is changed in place, with room for
// grow more records when they would more than double it (a cold start's
// first write: growing a map of 50,000 one by one copied it ten times).
func (m *Map) own(grow int) {
	if m.shared || grow > len(m.base) {
		base := make(map[model.ServiceName]Record, len(m.base)+grow)
		maps.Copy(base, m.base)
		m.base, m.shared = base, false
	}
}

func compareNames(a, b model.ServiceName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}
