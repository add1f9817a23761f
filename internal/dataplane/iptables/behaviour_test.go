package iptables

import (
	"testing"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
)

func newFakeProxier(t testing.TB, o dataplane.Options) (*Proxier, *Fake) {
	t.Helper()
	f := NewFake()
	p, err := New(Options{Options: o, Runner: f, ReadSysctl: func(string) (string, error) { return "0", nil }})
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
