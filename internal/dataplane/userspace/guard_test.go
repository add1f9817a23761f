package userspace

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	dpt "github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/model"
)

// recordingGuard records Set calls and, through addrs, which VIPs were
// already added when each Set ran.
type recordingGuard struct {
	addrs  *fakeAddrs
	sets   []guardState
	before [][]netip.Addr // addresses present when each Set ran
	err    error
}

func (g *recordingGuard) Check() error { return nil }
func (g *recordingGuard) Set(_ context.Context, vips []netip.Addr, served []GuardPort) error {
	if g.err != nil {
		return g.err
	}
	have, _ := g.addrs.List()
	slices.SortFunc(have, netip.Addr.Compare)
	g.before = append(g.before, have)
	g.sets = append(g.sets, guardState{vips: vips, served: served, set: true})
	return nil
}
func (g *recordingGuard) Cleanup(context.Context) error { return nil }
func (g *recordingGuard) Verify(context.Context, []netip.Addr, []GuardPort) error {
	return nil
}

func guardedProxier(t *testing.T, g *recordingGuard, log *strings.Builder) *Proxier {
	t.Helper()
	o := dpt.BaseOptions()
	o.Logger = slog.New(slog.NewTextHandler(log, nil))
	p, err := New(Options{
		Options: o,
		Addrs:   g.addrs,
		Guard:   g,
		LocalAddrs: func() ([]netip.Addr, error) {
			return []netip.Addr{dpt.NodeIPv4}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	p.bindableFn = func(a netip.Addr) bool { return a == dpt.NodeIPv4 }
	p.listenFn = func(context.Context, listenKey, *group) (io.Closer, error) { return nopCloser{}, nil }
	return p
}

// TestGuard: the guard covers a new VIP before its address is added, lets
// through exactly the ports served on it, never guards node addresses
// (an externalIP that is local), and follows removals.
func TestGuard(t *testing.T) {
	ctx := context.Background()
	g := &recordingGuard{addrs: &fakeAddrs{m: map[netip.Addr]bool{}}}
	var log strings.Builder
	p := guardedProxier(t, g, &log)
	vip := netip.MustParseAddr("10.96.0.70")
	web := dpt.Port("default/web", "http", model.TCP, 80, vip.String())
	web.ExternalIPs = []netip.Addr{dpt.NodeIPv4}
	web.Endpoints = []model.Endpoint{dpt.EP("10.1.1.5", 8080, true)}
	dpt.Fill(web)
	if err := p.Sync(ctx, dpt.NewState(web), true); err != nil {
		t.Fatal(err)
	}
	if len(g.sets) != 2 {
		t.Fatalf("%d guard Sets, want 2 (before adding addresses, after opening listeners)", len(g.sets))
	}
	if !slices.Equal(g.sets[0].vips, []netip.Addr{vip}) || len(g.before[0]) != 0 {
		t.Errorf("first Set guards %v with addresses %v present; want %s guarded before it is added", g.sets[0].vips, g.before[0], vip)
	}
	want := []GuardPort{{Proto: model.TCP, Addr: netip.AddrPortFrom(vip, 80)}}
	if last := g.sets[len(g.sets)-1]; !slices.Equal(last.vips, []netip.Addr{vip}) || !slices.Equal(last.served, want) {
		t.Errorf("guard %v serving %v, want %v serving %v", last.vips, last.served, []netip.Addr{vip}, want)
	}
	// The same State again changes nothing.
	if err := p.Sync(ctx, dpt.NewState(web), false); err != nil {
		t.Fatal(err)
	}
	if len(g.sets) != 2 {
		t.Errorf("an unchanged State set the guard again (%d Sets)", len(g.sets))
	}
	if err := p.Sync(ctx, dpt.NewState(), false); err != nil {
		t.Fatal(err)
	}
	if last := g.sets[len(g.sets)-1]; len(last.vips) != 0 || len(last.served) != 0 {
		t.Errorf("after the Service went, the guard holds %v %v", last.vips, last.served)
	}
}

// TestGuardUnavailable: a guard that cannot be installed at all (no
// nf_tables) does not fail syncs; the mode says once that it is unguarded.
func TestGuardUnavailable(t *testing.T) {
	ctx := context.Background()
	g := &recordingGuard{addrs: &fakeAddrs{m: map[netip.Addr]bool{}}, err: errors.New("nft: no nf_tables")}
	var log strings.Builder
	p := guardedProxier(t, g, &log)
	web := dpt.Fill(dpt.Port("default/web", "http", model.TCP, 80, "10.96.0.70"))
	for i := range 3 {
		if err := p.Sync(ctx, dpt.NewState(web), i == 0); err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
	}
	if n := strings.Count(log.String(), "cannot guard VIP addresses"); n != 1 {
		t.Errorf("%d warnings that the guard is missing, want 1:\n%s", n, log.String())
	}
	if err := p.Verify(ctx); err != nil {
		t.Errorf("Verify of an unguarded mode: %v", err)
	}
}
