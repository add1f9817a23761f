package conntrack

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

// candidateFlows returns UDP, SCTP and TCP flows from every frontend of
// ports (ClusterIPs, externalIPs, load-balancer IPs, and NodePorts on
// 172.16.0.1) to every endpoint of ports, to the frontend itself and to an
// unknown endpoint.
func candidateFlows(ports []*model.ServicePort) []Flow {
	replies := map[netip.AddrPort]bool{netip.MustParseAddrPort("10.9.9.9:9"): true}
	for _, sp := range ports {
		for _, e := range sp.Endpoints {
			replies[netip.AddrPortFrom(e.IP, e.Port)] = true
		}
	}
	var dsts []netip.AddrPort
	for _, sp := range ports {
		for _, list := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
			for _, a := range list {
				dsts = append(dsts, netip.AddrPortFrom(a, sp.Port))
			}
		}
		if sp.NodePort != 0 {
			dsts = append(dsts, netip.AddrPortFrom(netip.MustParseAddr("172.16.0.1"), sp.NodePort))
		}
	}
	slices.SortFunc(dsts, netip.AddrPort.Compare)
	dsts = slices.Compact(dsts)
	var out []Flow
	for _, d := range dsts {
		fam := model.IPv4
		if d.Addr().Is6() {
			fam = model.IPv6
		}
		src := netip.MustParseAddrPort("10.1.0.1:40000")
		if fam == model.IPv6 {
			src = netip.MustParseAddrPort("[fd00:1::1]:40000")
		}
		for _, proto := range []uint8{ProtoUDP, ProtoSCTP, ProtoTCP} {
			out = append(out, Flow{Family: fam, Protocol: proto, OrigSrc: src, OrigDst: d, ReplySrc: d, ReplyDst: src})
			for r := range replies {
				if r.Addr().Is6() == d.Addr().Is6() {
					out = append(out, Flow{Family: fam, Protocol: proto, OrigSrc: src, OrigDst: d, ReplySrc: r, ReplyDst: src})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Flow) int {
		if c := a.OrigDst.Compare(b.OrigDst); c != 0 {
			return c
		}
		if c := int(a.Protocol) - int(b.Protocol); c != 0 {
			return c
		}
		return a.ReplySrc.Compare(b.ReplySrc)
	})
	return out
}

// deletions runs r.Reconcile(st) on a table holding flows and returns the
// flows it deleted, in the order of flows.
func deletions(t *testing.T, r *Reconciler, st *model.State, flows []Flow) []Flow {
	t.Helper()
	fake := &Fake{}
	fake.Add(flows...)
	r.Table = fake
	if err := r.Reconcile(context.Background(), st); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	left := fake.Flows()
	var out []Flow
	for _, f := range flows {
		if !slices.Contains(left, f) {
			out = append(out, f)
		}
	}
	return out
}

// TestReconcilerIncremental checks that one Reconciler fed a sequence of
// States, sharing ServicePort pointers as model.Builder does, deletes
// exactly what a fresh Reconciler deletes for each State.
func TestReconcilerIncremental(t *testing.T) {
	s0 := testState()
	p := map[string]*model.ServicePort{}
	for _, sp := range s0.Ports {
		p[sp.Name.ServiceName.Name+"/"+string(sp.Protocol)] = sp
	}
	without := func(st *model.State, drop ...*model.ServicePort) *model.State {
		return &model.State{Ports: slices.DeleteFunc(slices.Clone(st.Ports), func(sp *model.ServicePort) bool {
			return slices.Contains(drop, sp)
		})}
	}
	// dns2 is dns with one endpoint replaced (a new pointer, as the Builder
	// makes for a changed Service).
	dns2 := port("dns", model.UDP, "10.96.0.10", 53, 0, ep("10.0.0.1:5353", true, true), ep("10.0.0.12:5353", true, true))
	// nodeTwin takes ext's NodePort once ext is gone; shared3 joins the
	// shared externalIP.
	nodeTwin := port("twin", model.UDP, "10.96.0.32", 501, 30500, ep("10.0.0.13:501", true, true))
	shared3 := port("shared3", model.UDP, "10.96.0.42", 600, 0, ep("10.0.0.14:600", true, true))
	shared3.ExternalIPs = addrs("192.0.2.9")
	emptied := port("empty", model.UDP, "10.96.0.20", 53, 0, ep("10.0.0.15:53", true, true))

	s3 := without(s0, p["ext/UDP"], p["shared2/UDP"])
	s4 := &model.State{Ports: append(slices.Clone(s3.Ports), nodeTwin, shared3)}
	s4.Ports[slices.Index(s4.Ports, p["dns/UDP"])] = dns2
	s5 := &model.State{Ports: append([]*model.ServicePort{p["ext/UDP"]}, s4.Ports...)}      // ext's old pointer again, order shifted
	s6 := &model.State{Ports: append(slices.Clone(s5.Ports), p["ext/UDP"], p["sctp/SCTP"])} // duplicated pointers
	s7 := without(s6, p["shared1/UDP"], shared3, p["sctp/SCTP"])
	s7.Ports[slices.Index(s7.Ports, p["empty/UDP"])] = emptied
	reversed := slices.Clone(s0.Ports)
	slices.Reverse(reversed)
	tcpOnly := &model.State{Ports: []*model.ServicePort{p["dns/TCP"]}}

	all := slices.Concat(s0.Ports, []*model.ServicePort{dns2, nodeTwin, shared3, emptied})
	flows := candidateFlows(all)

	steps := []struct {
		name string
		st   *model.State
	}{
		{"initial", s0},
		{"same State again", s0},
		{"new State, same pointers", &model.State{Ports: slices.Clone(s0.Ports)}},
		{"ports removed (NodePort owner, one of a shared externalIP)", s3},
		{"endpoints changed, NodePort and shared externalIP taken by new ports", s4},
		{"removed pointer reused, order shifted", s5},
		{"duplicated pointers", s6},
		{"shared externalIP and SCTP removed, empty port gains endpoints", s7},
		{"TCP only", tcpOnly},
		{"nil State", nil},
		{"back to the initial pointers, reversed", &model.State{Ports: reversed}},
		{"initial order", s0},
		{"empty State", &model.State{}},
		{"all at once", s6},
	}
	inc := &Reconciler{}
	for _, step := range steps {
		got := deletions(t, inc, step.st, flows)
		want := deletions(t, &Reconciler{}, step.st, flows)
		if !slices.Equal(got, want) {
			t.Errorf("%s: incremental deleted %d flows, fresh %d\nincremental: %v\nfresh:       %v",
				step.name, len(got), len(want), got, want)
		}
		if step.st != nil && len(step.st.Ports) > 1 && step.st != tcpOnly && len(want) == 0 {
			t.Errorf("%s: no flow deleted; the candidates do not exercise the State", step.name)
		}
	}
}

// TestIndexIncrementalRandom applies random changes (ports added, removed,
// replaced by a new pointer with other endpoints, reordered) to one index
// and compares its judgement of every candidate flow with a fresh index's.
func TestIndexIncrementalRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	newPort := func() *model.ServicePort {
		proto := []model.Protocol{model.UDP, model.UDP, model.SCTP, model.TCP}[rng.IntN(4)]
		vip := netip.AddrFrom4([4]byte{10, 96, 0, byte(rng.IntN(8))})
		var nodePort uint16
		if rng.IntN(2) == 0 {
			nodePort = uint16(30000 + rng.IntN(4))
		}
		var eps []model.Endpoint
		for e := rng.IntN(4); e > 0; e-- {
			ip := netip.AddrFrom4([4]byte{10, 0, 0, byte(1 + rng.IntN(10))})
			eps = append(eps, model.Endpoint{IP: ip, Port: 53, Ready: rng.IntN(3) > 0, Serving: rng.IntN(2) > 0})
		}
		sp := port("p", proto, vip.String(), uint16(53+rng.IntN(2)), nodePort, eps...)
		if rng.IntN(3) == 0 {
			sp.ExternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(rng.IntN(3))})}
		}
		return sp
	}
	var all, cur []*model.ServicePort
	for i := 0; i < 12; i++ {
		sp := newPort()
		all = append(all, sp)
		cur = append(cur, sp)
	}
	var removed []*model.ServicePort
	ix := &index{}
	for step := 0; step < 300; step++ {
		next := slices.Clone(cur)
		for c := rng.IntN(4); c > 0; c-- {
			switch op := rng.IntN(5); {
			case op == 0 && len(next) > 0: // remove
				i := rng.IntN(len(next))
				removed = append(removed, next[i])
				next = slices.Delete(next, i, i+1)
			case op == 1: // add a new port
				sp := newPort()
				all = append(all, sp)
				next = slices.Insert(next, rng.IntN(len(next)+1), sp)
			case op == 2 && len(next) > 0: // replace with a new pointer
				sp := newPort()
				all = append(all, sp)
				next[rng.IntN(len(next))] = sp
			case op == 3 && len(removed) > 0: // reuse a removed pointer
				next = slices.Insert(next, rng.IntN(len(next)+1), removed[rng.IntN(len(removed))])
			case op == 4 && len(next) > 1: // swap two
				i, j := rng.IntN(len(next)), rng.IntN(len(next))
				next[i], next[j] = next[j], next[i]
			}
		}
		cur = next
		st := &model.State{Ports: cur}
		ix.update(st)
		flows := candidateFlows(all)
		got, want := ix.stale(flows, StaleOptions{}), newIndex(st).stale(flows, StaleOptions{})
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: incremental index judged %d flows stale, fresh %d\nincremental: %v\nfresh:       %v",
				step, len(got), len(want), got, want)
		}
		udp := map[*model.ServicePort]bool{}
		for _, sp := range cur {
			if sp.Protocol != model.TCP {
				udp[sp] = true
			}
		}
		if len(ix.ports) != len(udp) {
			t.Fatalf("step %d: index holds %d ports, State has %d UDP/SCTP ports", step, len(ix.ports), len(udp))
		}
	}
}

// TestIndexSizedForTrackedPorts checks that an index of TCP ports, which
// it does not hold, costs little more than its slots (16 bytes a port):
// its maps were once sized for every port, 2.7 MB at 10,000.
func TestIndexSizedForTrackedPorts(t *testing.T) {
	st := benchState(10000)
	for _, sp := range st.Ports {
		sp.Protocol = model.TCP
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ix := newIndex(st)
	runtime.GC()
	runtime.ReadMemStats(&after)
	if len(ix.ports) != 0 {
		t.Fatalf("index holds %d TCP ports", len(ix.ports))
	}
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 600<<10 {
		t.Errorf("an index of 10,000 TCP ports holds %d KiB, want at most 600", grew>>10)
	}
	runtime.KeepAlive(ix)
}
