package model

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestPortNameCompare: Compare orders as the names' strings do, where a
// field is a prefix of the other's and the separators ('/', ':') meet
// letters on either side of them.
func TestPortNameCompare(t *testing.T) {
	pn := func(ns, name, port string, proto Protocol) ServicePortName {
		return ServicePortName{ServiceName: ServiceName{Namespace: ns, Name: name}, Port: port, Protocol: proto}
	}
	cases := []struct{ a, b ServicePortName }{
		{pn("a", "z", "", TCP), pn("a-b", "c", "", TCP)},         // "a/z" > "a-b/c": '/' > '-'
		{pn("a", "z", "", TCP), pn("a0", "c", "", TCP)},          // '/' < '0'
		{pn("ns", "web", "", TCP), pn("ns", "web-2", "", TCP)},   // "/TCP" against "-2/TCP"
		{pn("ns", "web", "", TCP), pn("ns", "web2", "", TCP)},    // '/' < '2'
		{pn("ns", "web", "http", TCP), pn("ns", "web", "", TCP)}, // ":http/TCP" against "/TCP"
		{pn("ns", "web", "a", TCP), pn("ns", "web", "a", UDP)},
		{pn("ns", "web", "a", TCP), pn("ns", "web", "a-b", TCP)},
		{pn("ns", "web", "", TCP), pn("ns", "web", "", TCP)},
		{pn("ns", "web", "", TCP), pn("nt", "a", "", TCP)},
		{pn("ns", "w", "", TCP), pn("ns", "web", "x", UDP)},
	}
	for _, c := range cases {
		for _, p := range [][2]ServicePortName{{c.a, c.b}, {c.b, c.a}} {
			want := strings.Compare(p[0].String(), p[1].String())
			if got := p[0].Compare(p[1]); got != want {
				t.Errorf("%s against %s: %d, want %d", p[0], p[1], got, want)
			}
		}
	}
	// Random names from separators, letters around them and a protocol
	// (so that one name's string may be a prefix of another's).
	r := rand.New(rand.NewPCG(1, 2))
	tokens := []string{"-", ".", "/", ":", "0", "a", "TCP"}
	word := func() string {
		var b strings.Builder
		for range r.IntN(4) {
			b.WriteString(tokens[r.IntN(len(tokens))])
		}
		return b.String()
	}
	protos := []Protocol{TCP, UDP, SCTP}
	for range 20000 {
		a := pn(word(), word(), word(), protos[r.IntN(3)])
		b := pn(word(), word(), word(), protos[r.IntN(3)])
		if got, want := a.Compare(b), strings.Compare(a.String(), b.String()); got != want {
			t.Fatalf("%q against %q: %d, want %d", a.String(), b.String(), got, want)
		}
	}
}
