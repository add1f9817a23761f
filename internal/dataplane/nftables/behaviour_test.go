package nftables

import (
	"io"
	"log/slog"
	"testing"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newFakeProxier(t *testing.T, o dataplane.Options) (*Proxier, *FakeTransport) {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quietLogger()
	}
	tr := NewFakeTransport()
	p, err := New(o, tr)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p, tr
}

func TestBehaviour(t *testing.T) {
	dataplanetest.RunBehaviour(t, func(t *testing.T, o dataplane.Options) (dataplane.Dataplane, dataplanetest.Tracer) {
		p, tr := newFakeProxier(t, o)
		return p, &fakeTracer{fake: tr.Fake}
	})
}
