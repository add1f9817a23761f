package main

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/vipproxy/vipproxy/internal/conntrack"
	"github.com/vipproxy/vipproxy/internal/model"
)

func TestParseQuery(t *testing.T) {
	tests := []struct {
		target, from string
		want         string // Dst/Proto/Src, or "error"
	}{
		{"10.96.0.10:80", "", "10.96.0.10:80/TCP/invalid IP"},
		{"10.96.0.10:53/udp", "10.244.1.5", "10.96.0.10:53/UDP/10.244.1.5"},
		{"[fd00::a]:80/SCTP", "", "[fd00::a]:80/SCTP/invalid IP"},
		{"10.96.0.10", "", "error"},
		{"10.96.0.10:80/gre", "", "error"},
		{"10.96.0.10:80", "nope", "error"},
	}
	for _, tc := range tests {
		q, err := parseQuery(tc.target, tc.from)
		got := "error"
		if err == nil {
			got = q.Dst.String() + "/" + string(q.Proto) + "/" + q.Src.String()
		}
		if got != tc.want {
			t.Errorf("parseQuery(%q, %q) = %s (%v), want %s", tc.target, tc.from, got, err, tc.want)
		}
	}
}

func TestCountConnections(t *testing.T) {
	ap := netip.MustParseAddrPort
	vip, ep1, ep2 := ap("10.96.0.10:80"), ap("10.244.1.5:8080"), ap("10.244.2.5:8080")
	flow := func(src, dst, reply netip.AddrPort, state uint8) conntrack.Flow {
		return conntrack.Flow{Family: model.IPv4, Protocol: conntrack.ProtoTCP, OrigSrc: src, OrigDst: dst, ReplySrc: reply, TCPState: state}
	}
	c := ap("10.244.1.9:40000")
	flows := []conntrack.Flow{
		flow(c, vip, ep1, conntrack.TCPEstablished),
		flow(c, vip, ep1, conntrack.TCPEstablished),
		flow(c, vip, ep2, conntrack.TCPTimeWait),                    // not live
		flow(c, ep2, ep2, conntrack.TCPEstablished),                 // direct, not through the VIP
		flow(c, ap("10.96.0.11:80"), ep2, conntrack.TCPEstablished), // another Service
	}
	newX := func() *model.Explanation {
		return &model.Explanation{Endpoints: []model.ExplainEndpoint{{Endpoint: ep1.String()}, {Endpoint: ep2.String()}}}
	}
	x := newX()
	countConnections(x, flows, vip, false)
	if x.Endpoints[0].Connections != 2 || x.Endpoints[1].Connections != 0 {
		t.Errorf("netfilter modes: connections %d, %d; want 2, 0", x.Endpoints[0].Connections, x.Endpoints[1].Connections)
	}
	x = newX()
	countConnections(x, flows, vip, true)
	if x.Endpoints[0].Connections != 0 || x.Endpoints[1].Connections != 1 {
		t.Errorf("userspace: connections %d, %d; want 0, 1", x.Endpoints[0].Connections, x.Endpoints[1].Connections)
	}
}

// TestRunExplain: the command asks /explain and prints the text, or the
// JSON with --json; flags may follow the address.
func TestRunExplain(t *testing.T) {
	var asked model.Query
	srv := httptest.NewServer(explainHandler(func(q model.Query) (*model.Explanation, error) {
		asked = q
		x := &model.Explanation{ServicePort: "default/web:http/TCP", Via: "clusterIP", Verdict: "DNAT to one of 1 endpoint(s) (random)",
			Endpoints: []model.ExplainEndpoint{{Endpoint: "10.244.1.5:8080", Eligible: true, Reason: "ready", Weight: 1, Connections: 3}}}
		x.Query.Dst, x.Query.Protocol = q.Dst.String(), string(q.Proto)
		return x, nil
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	var out, errb bytes.Buffer
	if rc := run([]string{"explain", "10.96.0.10:80/udp", "--from", "10.244.2.9", "--metrics-address", addr}, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	if asked.Dst != netip.MustParseAddrPort("10.96.0.10:80") || asked.Proto != model.UDP || asked.Src != netip.MustParseAddr("10.244.2.9") {
		t.Errorf("server was asked %+v", asked)
	}
	for _, want := range []string{"service port: default/web:http/TCP (clusterIP)", "+ 10.244.1.5:8080", "conns 3", "ready"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if rc := run([]string{"explain", "--json", "--metrics-address", addr, "10.96.0.10:80"}, &out, &errb); rc != 0 {
		t.Fatalf("--json: exit %d: %s", rc, errb.String())
	}
	var x model.Explanation
	if err := json.Unmarshal(out.Bytes(), &x); err != nil || x.Endpoints[0].Connections != 3 {
		t.Errorf("--json printed %q (%v)", out.String(), err)
	}
	for _, args := range [][]string{{"explain"}, {"explain", "nonsense"}, {"explain", "10.96.0.10:80", "10.96.0.11:80"}} {
		if rc := run(args, &out, &errb); rc != 2 {
			t.Errorf("%v: exit %d, want 2", args, rc)
		}
	}
	if rc := run([]string{"explain", "10.96.0.10:80", "--metrics-address", "127.0.0.1:1"}, &out, &errb); rc != 1 {
		t.Errorf("no server: exit %d, want 1", rc)
	}
}
