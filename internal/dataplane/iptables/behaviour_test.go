package iptables

import (
	"testing"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/sysctl"
)

func newFakeProxier(t testing.TB, o dataplane.Options) (*Proxier, *Fake) {
	t.Helper()
	f := NewFake()
	p, err := New(Options{Options: o, Runner: f, Sysctl: &sysctl.Fake{Values: map[string]string{"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal": "0"}}})
	if err != nil {
		t.Fatal(err)
	}
	return p, f
}

func TestBehaviour(t *testing.T) {
	dataplanetest.RunBehaviour(t, func(t *testing.T, o dataplane.Options) (dataplane.Dataplane, dataplanetest.Tracer) {
		p, f := newFakeProxier(t, o)
		return p, fakeTracer{f}
	})
}
