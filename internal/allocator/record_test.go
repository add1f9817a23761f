package allocator

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"slices"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

// TestAppendRecordMatchesJSON: appendRecord writes what json.Marshal
// writes, byte for byte (the stored format does not depend on which
// wrote it), after what the buffer held, and decodeRecord reads it back.
func TestAppendRecordMatchesJSON(t *testing.T) {
	ips := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, x := range s {
			out = append(out, netip.MustParseAddr(x))
		}
		return out
	}
	port := func(name string, proto model.Protocol, p uint16) PortAssignment {
		return PortAssignment{Name: name, Protocol: proto, NodePort: p}
	}
	for _, tc := range []struct {
		name string
		r    Record
	}{
		{"empty", Record{}},
		{"one IP", Record{ClusterIPs: ips("10.96.0.10")}},
		{"dual stack", Record{ClusterIPs: ips("fd00::a", "10.96.0.10")}},
		{"mapped", Record{ClusterIPs: ips("::ffff:10.0.0.1")}},
		{"zero address", Record{ClusterIPs: []netip.Addr{{}}}},
		{"zone", Record{ClusterIPs: ips("fe80::1%eth0")}},
		{"zone to escape", Record{ClusterIPs: ips(`fe80::1%a"<b`)}},
		{"ports only", Record{NodePorts: []PortAssignment{port("http", model.TCP, 30080), port("", model.UDP, 0)}}},
		{"health check only", Record{HealthCheckNodePort: 31000}},
		{"all", Record{ClusterIPs: ips("10.96.0.1"), NodePorts: []PortAssignment{port("dns", model.SCTP, 65535)}, HealthCheckNodePort: 1}},
		{"quote in name", Record{NodePorts: []PortAssignment{port(`a""b`, model.TCP, 1)}}},
		{"backslash", Record{NodePorts: []PortAssignment{port(`a\b`, model.TCP, 1)}}},
		{"html", Record{NodePorts: []PortAssignment{port("<a>&", model.TCP, 1)}}},
		{"unicode", Record{NodePorts: []PortAssignment{port("é\u2028", model.TCP, 1)}}},
		{"control", Record{NodePorts: []PortAssignment{port("a\x01\n", model.TCP, 1)}}},
		{"invalid UTF-8", Record{NodePorts: []PortAssignment{port("a\xff", model.TCP, 1)}}},
		{"strange protocol", Record{NodePorts: []PortAssignment{port("x", model.Protocol(`"`), 1)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := json.Marshal(tc.r)
			if err != nil {
				t.Fatal(err)
			}
			got, err := appendRecord([]byte("prefix"), tc.r)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, append([]byte("prefix"), want...)) {
				t.Fatalf("appendRecord wrote\n%s\njson.Marshal\n%s", got[6:], want)
			}
			back, err := decodeRecord(got[6:])
			if err != nil {
				t.Fatal(err)
			}
			if w, _ := decodeRecord(want); !back.equal(w) {
				t.Fatalf("read back %+v, want %+v", back, w)
			}
		})
	}
}

// TestEncodeChanges: one put per change in key order, deletions with a
// nil value, every key and value intact once the buffers have grown.
func TestEncodeChanges(t *testing.T) {
	changes := map[model.ServiceName]*Record{}
	var names []string
	for i := range 300 {
		n := model.ServiceName{Namespace: "ns" + string(rune('a'+i%7)), Name: "svc-" + string(rune('a'+i%26)) + string(rune('a'+i/26))}
		var r *Record
		if i%5 != 0 {
			r = &Record{ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}, HealthCheckNodePort: uint16(i)}
		}
		changes[n] = r
		names = append(names, serviceKey(n))
	}
	slices.Sort(names)
	puts, err := encodeChanges(changes)
	if err != nil {
		t.Fatal(err)
	}
	if len(puts) != len(names) {
		t.Fatalf("%d puts for %d changes", len(puts), len(names))
	}
	for i, p := range puts {
		if string(p.key) != names[i] {
			t.Fatalf("put %d is %q, want %q (key order)", i, p.key, names[i])
		}
		n, err := parseServiceKey(string(p.key))
		if err != nil {
			t.Fatal(err)
		}
		r := changes[n]
		if r == nil {
			if p.val != nil {
				t.Errorf("%s: deleted, but the put has a value", n)
			}
			continue
		}
		if want, _ := json.Marshal(*r); !bytes.Equal(p.val, want) {
			t.Errorf("%s: value %s, want %s", n, p.val, want)
		}
	}
}
