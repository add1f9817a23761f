package iptables

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

// TestPackedMembers: members of both families and every protocol come
// back from a packed list as they went in, in order; an IPv4 member
// takes one word, an IPv6 one three.
func TestPackedMembers(t *testing.T) {
	m := func(ap string, proto model.Protocol) setMember {
		return newSetMember(netip.MustParseAddrPort(ap), proto)
	}
	in := []setMember{
		m("10.1.0.1:8080", model.TCP),
		m("[fd00::1]:53", model.UDP),
		m("255.255.255.255:65535", model.SCTP),
		m("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:1", model.TCP),
		m("0.0.0.0:0", model.UDP),
		m("[::1]:65535", model.SCTP),
	}
	p := packMembers(in)
	if len(p) != 3*1+3*3 || cap(p) != len(p) {
		t.Errorf("%d words (cap %d), want 12", len(p), cap(p))
	}
	var out []setMember
	p.each(func(m setMember) { out = append(out, m) })
	if !slices.Equal(out, in) {
		t.Errorf("unpacked %v, want %v", out, in)
	}
	for _, x := range in {
		if e := hairpinKind.entry(x); e.IP.Is4() != (x.ip[0] == 0 && x.ip[10] == 0xff) {
			t.Errorf("%v: entry %v in the wrong family", x, e)
		}
	}

	// memberCounts keeps each family's counts apart and drops zeros.
	var c memberCounts
	for i, x := range in {
		c.set(x, int32(i+1))
	}
	for i, x := range in {
		if got := c.get(x); got != int32(i+1) {
			t.Errorf("count of %v: %d, want %d", x, got, i+1)
		}
	}
	if c.len() != len(in) || len(c.v4) != 3 || len(c.v6) != 3 {
		t.Errorf("len %d (v4 %d, v6 %d), want 6 (3, 3)", c.len(), len(c.v4), len(c.v6))
	}
	c.set(in[0], 0)
	c.set(in[1], 0)
	if c.get(in[0]) != 0 || c.get(in[1]) != 0 || c.len() != 4 {
		t.Errorf("after two zeros: %d, %d, len %d", c.get(in[0]), c.get(in[1]), c.len())
	}
	var none *memberCounts
	if none.get(in[0]) != 0 || none.len() != 0 {
		t.Error("a nil memberCounts is not empty")
	}
}
