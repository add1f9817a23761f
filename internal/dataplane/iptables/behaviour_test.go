package iptables

import (
	"testing"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/sysctl"
)

// newFakeProxier returns a Proxier over a Fake in the layout production
// uses where ipset works: hairpin sets in an ipset.Fake (p.sets).
func newFakeProxier(t testing.TB, o dataplane.Options) (*Proxier, *Fake) {
	t.Helper()
	return newFakeProxierLayout(t, o, true)
}

// newFakeProxierLayout returns a Proxier over a Fake, with hairpin sets
// (an ipset.Fake) or, without, in kube-proxy's layout of a chain per
// endpoint.
func newFakeProxierLayout(t testing.TB, o dataplane.Options, sets bool) (*Proxier, *Fake) {
	t.Helper()
	f := NewFake()
	opts := Options{Options: o, Runner: f, Sysctl: &sysctl.Fake{Values: map[string]string{"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal": "0"}}}
	if sets {
		opts.IPSet = &ipset.Fake{}
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return p, f
}

// fakeSets returns p's ipset.Fake, or nil in kube-proxy's layout.
func fakeSets(p *Proxier) *ipset.Fake {
	s, _ := p.sets.(*ipset.Fake)
	return s
}

func TestBehaviour(t *testing.T) {
	for _, layout := range []struct {
		name string
		sets bool
	}{{"hairpin-set", true}, {"chain-per-endpoint", false}} {
		t.Run(layout.name, func(t *testing.T) {
			dataplanetest.RunBehaviour(t, func(t *testing.T, o dataplane.Options) (dataplane.Dataplane, dataplanetest.Tracer) {
				p, f := newFakeProxierLayout(t, o, layout.sets)
				return p, fakeTracer{f: f, sets: fakeSets(p)}
			})
		})
	}
}
