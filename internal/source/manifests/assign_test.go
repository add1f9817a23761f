package manifests

// Tests of ClusterIP and NodePort assignment through Options.Assigner.

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/source"
)

// fakeAssigner hands out 10.96.1.N and NodePorts 30000+N, and records calls.
type fakeAssigner struct {
	mu       sync.Mutex
	next     int
	assigned map[model.ServiceName]netip.Addr
	assigns  []string
	releases []string
	fail     map[string]bool // Service names whose Assign fails
}

func (f *fakeAssigner) Assign(_ context.Context, svc model.Service) (model.Service, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.assigns = append(f.assigns, svc.Name)
	if f.fail[svc.Name] {
		return svc, fmt.Errorf("10.96.0.10 is taken by default/other")
	}
	if len(svc.ClusterIPs) == 0 && !svc.Headless {
		ip, ok := f.assigned[svc.ServiceName]
		if !ok {
			f.next++
			ip = netip.AddrFrom4([4]byte{10, 96, 1, byte(f.next)})
			f.assigned[svc.ServiceName] = ip
		}
		svc.ClusterIPs = []netip.Addr{ip}
	}
	ports := append([]model.ServicePortSpec(nil), svc.Ports...)
	for i := range ports {
		if svc.Type == model.TypeNodePort && ports[i].NodePort == 0 {
			ports[i].NodePort = uint16(30000 + i)
		}
	}
	svc.Ports = ports
	return svc, nil
}

func (f *fakeAssigner) Release(_ context.Context, name model.ServiceName) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releases = append(f.releases, name.Name)
	delete(f.assigned, name)
	return nil
}

func (f *fakeAssigner) calls() (assigns, releases string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.assigns, ","), strings.Join(f.releases, ",")
}

func TestSourceAssigner(t *testing.T) {
	fa := &fakeAssigner{assigned: map[model.ServiceName]netip.Addr{}, fail: map[string]bool{"taken": true}}
	np := strings.Replace(svcYAML("np", "", 80), "spec:", "spec:\n  type: NodePort", 1)
	h := start(t, Options{Assigner: fa}, map[string]string{
		"a.yaml": join(svcYAML("web", "", 80), np),
		"b.yaml": svcYAML("taken", "10.96.0.10", 80),
	})
	s := h.last
	if web := findService(s, "web"); web == nil || len(web.ClusterIPs) != 1 || web.ClusterIPs[0] != netip.MustParseAddr("10.96.1.1") {
		t.Fatalf("web not assigned 10.96.1.1: %s", describe(s))
	}
	if n := findService(s, "np"); n == nil || n.Ports[0].NodePort != 30000 {
		t.Fatalf("np not assigned a NodePort: %s", describe(s))
	}
	if findService(s, "taken") != nil || !hasProblem(s, "file b.yaml document 1 (Service default/taken)", "") {
		t.Fatalf("Service whose Assign failed should be refused with a problem: %s", describe(s))
	}

	// Changing only b.yaml must not re-assign a.yaml's Services.
	fa.mu.Lock()
	fa.assigns, fa.fail = nil, nil
	fa.mu.Unlock()
	write(t, h.dir, "b.yaml", svcYAML("taken", "10.96.0.10", 81))
	h.until("taken assigned", func(s *model.Snapshot) bool { return servicePort(s, "taken") == 81 }, nil)
	if a, _ := fa.calls(); a != "taken" {
		t.Errorf("Assign calls after editing b.yaml = %q, want only \"taken\"", a)
	}

	// Removing a Service releases it; the other keeps its IP.
	write(t, h.dir, "a.yaml", np)
	s = h.until("web removed", func(s *model.Snapshot) bool { return findService(s, "web") == nil }, nil)
	if _, r := fa.calls(); r != "web" {
		t.Errorf("Release calls = %q, want \"web\"", r)
	}
	if n := findService(s, "np"); n == nil || n.ClusterIPs[0] != netip.MustParseAddr("10.96.1.2") {
		t.Errorf("np lost its IP: %s", describe(s))
	}
}

// batchAssigner is a fakeAssigner that can also batch; it records batches.
type batchAssigner struct {
	*fakeAssigner
	batches []int
}

func (b *batchAssigner) AssignAll(ctx context.Context, svcs []*model.Service) ([]*model.Service, []error) {
	b.mu.Lock()
	b.batches = append(b.batches, len(svcs))
	b.mu.Unlock()
	out := make([]*model.Service, len(svcs))
	errs := make([]error, len(svcs))
	for i, svc := range svcs {
		o, err := b.fakeAssigner.Assign(ctx, *svc)
		out[i], errs[i] = &o, err
	}
	return out, errs
}

// TestSourceBatchAssigner checks that a cold read assigns every Service in
// one batch (one durable write per batch, not per Service), with the same
// results and per-Service failures as one at a time.
func TestSourceBatchAssigner(t *testing.T) {
	ba := &batchAssigner{fakeAssigner: &fakeAssigner{assigned: map[model.ServiceName]netip.Addr{}, fail: map[string]bool{"taken": true}}}
	h := start(t, Options{Assigner: ba}, map[string]string{
		"a.yaml": join(svcYAML("web", "", 80), svcYAML("api", "", 81), svcYAML("db", "", 82)),
		"b.yaml": svcYAML("taken", "10.96.0.10", 80),
	})
	s := h.last
	for _, name := range []string{"web", "api", "db"} {
		if svc := findService(s, name); svc == nil || len(svc.ClusterIPs) != 1 {
			t.Errorf("%s not assigned: %s", name, describe(s))
		}
	}
	if findService(s, "taken") != nil || !hasProblem(s, "file b.yaml document 1 (Service default/taken)", "") {
		t.Errorf("a failed Service in the batch should be refused alone: %s", describe(s))
	}
	ba.mu.Lock()
	batches, calls := ba.batches, len(ba.assigns)
	ba.mu.Unlock()
	if len(batches) != 1 || batches[0] != 4 || calls != 4 {
		t.Errorf("batches %v with %d assigns, want one batch of 4", batches, calls)
	}
}

// TestAssignedSharesDecoded checks that a Service the Assigner left as it
// was (its manifest names its addresses) goes into the snapshot as the
// decoded object itself, not a second copy, that one the Assigner filled
// in is its own object, and that a batch's results are not kept.
func TestAssignedSharesDecoded(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", join(svcYAML("full", "10.96.0.20", 80), svcYAML("web", "", 80)))
	fa := &fakeAssigner{assigned: map[model.ServiceName]netip.Addr{}}
	for _, batch := range []bool{false, true} {
		var as source.Assigner = fa
		if batch {
			as = &batchAssigner{fakeAssigner: fa}
		}
		s := New(Options{Dir: dir, Assigner: as})
		snap := s.rescan(context.Background(), true)
		decoded := map[string]*model.Service{}
		for _, e := range s.files["a.yaml"].good {
			if e.svc != nil {
				decoded[e.svc.Name] = e.svc
			}
		}
		if got := findService(snap, "full"); got == nil || got != decoded["full"] {
			t.Errorf("batch %v: full is %p, want the decoded %p", batch, got, decoded["full"])
		}
		if got := findService(snap, "web"); got == nil || got == decoded["web"] || len(got.ClusterIPs) != 1 {
			t.Errorf("batch %v: web = %+v, want an assigned copy of the decoded %p", batch, got, decoded["web"])
		}
		if s.assigns.batch != nil {
			t.Errorf("batch %v: the batch's %d results are kept after the snapshot", batch, len(s.assigns.batch))
		}
	}
}
