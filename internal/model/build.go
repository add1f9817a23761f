package model

import (
	"encoding/binary"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// BuildOptions configures Build.
type BuildOptions struct {
	// NodeName is this node's name: endpoints whose nodeName equals it are
	// Local. Empty means snap.Node's name, and when that is unknown too no
	// endpoint is Local (Local-policy traffic then finds no endpoints).
	NodeName string
	// ServiceCIDRs are the service ranges when this node knows them
	// (standalone mode, where vipproxy allocates from them). An externalIP
	// inside one is refused: it could take over a ClusterIP handed out later.
	ServiceCIDRs []netip.Prefix
	// DeriveHints derives topology hints that EndpointSlices lack from the
	// Service's trafficDistribution (see DeriveHints), as the EndpointSlice
	// controller would write them. Standalone mode sets it: no controller
	// writes hints there. In Kubernetes mode a slice without hints has
	// none on purpose, and kube-proxy then uses every endpoint.
	DeriveHints bool
	// ExternalIPCIDRs is the --external-ip-cidrs allow-list: when not
	// empty, an externalIP outside every prefix is refused. Empty allows
	// every address the other rules allow (kube-proxy's behaviour).
	ExternalIPCIDRs []netip.Prefix
	// Balances are the balancing algorithms the dataplane implements; nil
	// means all of them. A Service asking for another one (or for an
	// unknown one) is built with BalanceDefault and a Problem naming its
	// AnnotationBalance annotation.
	Balances []Balance
	// OutlierEjection is the default for Services without the
	// AnnotationOutlierEjection annotation.
	OutlierEjection bool
	// QuietFlows says vipproxy reads conntrack events for outlier
	// ejection only: every port but those whose flows it reads
	// (ServicePort.FlowsRead) is built with ServicePort.QuietFlows, and
	// those with ServicePort.SampledFlows.
	QuietFlows bool
}

// Build turns a Snapshot into the State dataplanes program. It never fails:
// whatever it refuses becomes a Problem and the rest is built.
//
//   - Every Service port (spec.ports entry) becomes one ServicePort named
//     namespace/name:portName/PROTOCOL. Headless and ExternalName Services
//     produce none. A port whose name+protocol or port+protocol repeats an
//     earlier port of the Service is skipped with a Problem; so is a second
//     Service of the same namespace/name.
//   - VIP hijacks are refused (CVE-2020-8554 class): an externalIP or
//     load-balancer IP that is loopback, link-local, multicast or
//     unspecified is dropped with a Problem (the node's own services and
//     the metadata address 169.254.169.254 stay out of reach); so is an
//     externalIP inside opts.ServiceCIDRs or, when opts.ExternalIPCIDRs is
//     set, outside all of them. An externalIP or load-balancer IP equal to
//     any Service's ClusterIP is dropped from its Service with a Problem
//     naming both Services: a ClusterIP always wins, whatever the names.
//   - Empty Type becomes ClusterIP; empty traffic policies become Cluster.
//     externalIPs and load-balancer IPs of an address family the Service
//     has no ClusterIP of are dropped (as kube-proxy's per-family proxiers
//     ignore them); a dropped externalIP is reported as a Problem.
//   - The EndpointSlices of a Service (matched by Slice.Service) are merged:
//     a slice port feeds the Service port of the same name and protocol
//     (slice ports without a port number are ignored). Only addresses[0]
//     of an endpoint is used, as upstream does. An endpoint is skipped with
//     a Problem naming the slice and field ("endpoints[3].addresses[0]")
//     when it has no address, its address is not of the slice's
//     addressType, or CheckEndpointIP refuses it. A slice whose
//     addressType is not IPv4/IPv6, or of a family the Service has no
//     ClusterIP of, is skipped with a Problem.
//   - The same address+port from several slices (or twice in one) appears
//     once. When the copies disagree the best is kept: ready over not
//     ready, then serving over not serving, then not terminating over
//     terminating, then the copy from the slice whose name sorts first
//     (then the first in that slice). This matches kube-proxy's preference
//     for ready duplicates and makes the result independent of the order
//     slices arrive in.
//   - Endpoints are sorted by address then port and marked Local when
//     their nodeName is this node's. With opts.DeriveHints, an endpoint
//     without hints gets those DeriveHints gives it. ClusterEndpoints and LocalEndpoints
//     come from CategorizeEndpoints with the zone of snap.Node.
//   - Each ServicePort is validated (ServicePort.Validate); an invalid one
//     is skipped with one Problem per broken field, naming the Service
//     ("Service ns/name") and the field ("spec.ports[1].nodePort"); the
//     other ports and Services are kept.
//   - State.Ports is sorted by Name.String(); State.Problems holds
//     snap.Problems followed by Build's own, in Service-name order.
//
// Build is deterministic: equal Snapshots (same order of Services and of
// slices) give deep-equal States, and reordering Services or slices
// changes nothing — except which copy wins when two Services share a
// namespace/name or two slices of a Service share a name (the first in
// input order). The State shares
// hint slices with snap and may share backing arrays between Endpoints,
// ClusterEndpoints and LocalEndpoints: treat it as read-only.
func Build(snap *Snapshot, opts BuildOptions) *State {
	var b builder
	return b.build(snap, opts, nil)
}

// build is Build. With c non-nil it reuses c's ServicePorts of Services
// whose inputs are unchanged and records what it built in c (see Builder).
func (b *builder) build(snap *Snapshot, opts BuildOptions, c *Builder) *State {
	b.snap = snap
	b.opts = opts
	b.nodeName = opts.NodeName
	if b.nodeName == "" && snap.Node != nil {
		b.nodeName = snap.Node.Name
	}
	b.zone = snap.Node.Zone()
	if c != nil && c.begin(b.nodeName, b.zone, opts, len(snap.Services)) && c.patchable(snap) {
		if st := b.patch(snap, c); st != nil {
			return st
		}
	}
	st := &State{NodeName: b.nodeName, Node: snap.Node}
	b.problems = append([]Problem(nil), snap.Problems...)

	// Index slices by Service: sliceHead[name] is its first slice in input
	// order, sliceNext links the others.
	if b.sliceHead == nil {
		b.sliceHead = make(map[ServiceName]int32, len(snap.Services))
	} else {
		clear(b.sliceHead)
	}
	b.sliceNext = slices.Grow(b.sliceNext[:0], len(snap.Slices))[:len(snap.Slices)]
	for i := len(snap.Slices) - 1; i >= 0; i-- {
		n := snap.Slices[i].Service
		next, ok := b.sliceHead[n]
		if !ok {
			next = -1
		}
		b.sliceNext[i] = next
		b.sliceHead[n] = int32(i)
	}

	order := slices.Grow(b.order[:0], len(snap.Services))[:len(snap.Services)]
	b.order = order
	for i := range order {
		order[i] = i
	}
	byName := func(x, y int) int {
		return compareServiceName(snap.Services[x].ServiceName, snap.Services[y].ServiceName)
	}
	if !slices.IsSortedFunc(order, byName) {
		slices.SortStableFunc(order, byName)
	}

	ports := b.ports[:0]
	dups := false
	var pre []serviceResult
	if len(order) >= parallelBuildFrom {
		pre = b.servicesParallel(order, c)
	}
	for n, i := range order {
		svc := snap.Services[i]
		if n > 0 && snap.Services[order[n-1]].ServiceName == svc.ServiceName {
			dups = true
			b.problem("Service "+svc.ServiceName.String(), "metadata.name", svc.Name, "duplicate Service; the first one is used")
			continue
		}
		var r serviceResult
		if pre != nil {
			r = pre[n]
		} else {
			r = b.serviceResult(svc, c)
		}
		if r.cached != nil {
			ports = append(ports, r.cached.ports...)
			b.problems = append(b.problems, r.cached.problems...)
			continue
		}
		k0 := len(ports)
		for _, sp := range r.ports {
			ports = append(ports, sp)
		}
		b.problems = append(b.problems, r.problems...)
		if c != nil {
			c.store(svc, r.slices, ports[k0:], r.problems)
		}
	}
	if !slices.IsSortedFunc(ports, comparePorts) {
		slices.SortFunc(ports, comparePorts)
	}
	st.Ports = slices.Clone(ports)
	st.Uses = UsesOf(ports)
	if c != nil {
		c.remember(snap, st.Ports, dups)
		c.uses = *st.Uses
	}
	b.resolveClusterIPClaims(st, c)
	clear(ports) // drop references to this State's ports from the scratch buffer
	b.ports = ports[:0]
	if c != nil {
		c.end()
	}
	st.Problems = b.problems
	b.problems, b.snap = nil, nil
	return st
}

// serviceResult is what a Build makes of one Service: the result c
// remembered for it (cached), or its ports and the problems found.
type serviceResult struct {
	cached   *builtService
	ports    []*ServicePort
	problems []Problem
	// slices are the Service's slices, for its cache entry (with a
	// Builder only).
	slices []*EndpointSlice
}

// serviceResult builds svc, or finds it in c. It writes only b's scratch
// (b.problems is as it was) and what c.lookup marks on svc's own entry.
func (b *builder) serviceResult(svc *Service, c *Builder) serviceResult {
	idx := b.slicesFor(svc.ServiceName)
	if c != nil {
		if e := c.lookup(svc, b.snap.Slices, idx); e != nil {
			return serviceResult{cached: e}
		}
	}
	var r serviceResult
	if c != nil {
		r.slices = slicesOf(b.snap.Slices, idx) // here, on the Build's goroutines, with idx at hand
	}
	problems := b.problems
	b.problems = b.svcProblems[:0]
	r.ports = b.service(svc, idx)
	r.problems = slices.Clone(b.problems)
	b.svcProblems, b.problems = b.problems, problems
	return r
}

// parallelBuildFrom is the number of Services from which a full Build
// spreads them over the CPUs.
var parallelBuildFrom = 2000

// servicesParallel returns serviceResult of each Service of order (a
// duplicate's is empty) built over GOMAXPROCS goroutines, each with a
// builder of its own scratch: a Service's ports depend on it, its slices
// and the options only, and c is only read (and each Service's own entry
// marked). At 50,000 Services the Build was 0.2 s of a restart, on one
// CPU.
func (b *builder) servicesParallel(order []int, c *Builder) []serviceResult {
	out := make([]serviceResult, len(order))
	svcs := b.snap.Services
	const chunk = 256
	var next atomic.Int64
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		w := &builder{snap: b.snap, opts: b.opts, nodeName: b.nodeName, zone: b.zone, sliceHead: b.sliceHead, sliceNext: b.sliceNext}
		wg.Go(func() {
			for {
				lo := int(next.Add(chunk)) - chunk
				if lo >= len(order) {
					return
				}
				for n := lo; n < min(lo+chunk, len(order)); n++ {
					svc := svcs[order[n]]
					if n > 0 && svcs[order[n-1]].ServiceName == svc.ServiceName {
						continue // a duplicate: the caller words it
					}
					out[n] = w.serviceResult(svc, c)
				}
			}
		})
	}
	wg.Wait()
	return out
}

// comparePorts is the order of a State's ports: by name, as its String.
func comparePorts(x, y *ServicePort) int { return x.Name.Compare(y.Name) }

// slicesFor returns the indices into b.snap.Slices of the slices of
// Service n, sorted by slice name (stable: input order among equal
// names). The result is a scratch buffer, valid until the next call.
func (b *builder) slicesFor(n ServiceName) []int {
	idx := b.idx[:0]
	if i, ok := b.sliceHead[n]; ok {
		for ; i >= 0; i = b.sliceNext[i] {
			idx = append(idx, int(i))
		}
	}
	b.idx = idx
	ss := b.snap.Slices
	if len(idx) > 16 {
		slices.SortStableFunc(idx, func(x, y int) int { return strings.Compare(ss[x].Name, ss[y].Name) })
	} else if len(idx) > 1 {
		// Insertion sort: stable, and a Service rarely has many slices.
		for i := 1; i < len(idx); i++ {
			for j := i; j > 0 && ss[idx[j-1]].Name > ss[idx[j]].Name; j-- {
				idx[j-1], idx[j] = idx[j], idx[j-1]
			}
		}
	}
	return idx
}

type builder struct {
	snap     *Snapshot
	opts     BuildOptions
	nodeName string
	zone     string
	problems []Problem
	// Scratch, reused across Services (and across Builds by a Builder).
	sliceHead map[ServiceName]int32
	sliceNext []int32
	order     []int
	idx       []int
	ports     []*ServicePort
	cands     [][]candidate
	// svcProblems collects one Service's problems (see serviceResult).
	svcProblems []Problem
}

func (b *builder) problem(object, field, value, reason string) {
	b.problems = append(b.problems, Problem{Object: object, Field: field, Value: value, Reason: reason})
}

// service builds the valid ServicePorts of svc from the slices
// b.snap.Slices[idx] (sorted by name).
func (b *builder) service(svc *Service, idx []int) []*ServicePort {
	if svc.Headless || svc.Type == TypeExternalName {
		return nil
	}
	typ := svc.Type
	if typ == "" {
		typ = TypeClusterIP
	}
	var fam4, fam6 bool
	for _, a := range svc.ClusterIPs {
		fam4 = fam4 || a.Is4()
		fam6 = fam6 || a.Is6()
	}
	familyOK := func(a netip.Addr) bool { return (a.Is4() && fam4) || (a.Is6() && fam6) }
	externalIPs := svc.ExternalIPs
	extOK := func(a netip.Addr) bool { return familyOK(a) && b.externalIPProblem(a) == "" }
	if !allFunc(externalIPs, extOK) {
		externalIPs = nil
		for i, a := range svc.ExternalIPs {
			switch {
			case !familyOK(a) && len(svc.ClusterIPs) > 0:
				b.problem(serviceObject(svc), "spec.externalIPs["+strconv.Itoa(i)+"]", a.String(), "no ClusterIP of this address family; ignored")
			case b.externalIPProblem(a) != "":
				b.problem(serviceObject(svc), "spec.externalIPs["+strconv.Itoa(i)+"]", a.String(), "refused: "+b.externalIPProblem(a)+"; ignored")
			default:
				externalIPs = append(externalIPs, a)
			}
		}
	}
	balance := svc.Balance
	if balance != BalanceDefault && b.opts.Balances != nil && !slices.Contains(b.opts.Balances, balance) {
		b.problem(serviceObject(svc), "metadata.annotations["+AnnotationBalance+"]", string(balance),
			"not supported by this proxy mode (supported: "+balanceList(b.opts.Balances)+"); the mode's default is used")
		balance = BalanceDefault
	}
	lbIPs := svc.LoadBalancerIPs
	lbOK := func(a netip.Addr) bool { return familyOK(a) && hijackProblem(a) == "" }
	if !allFunc(lbIPs, lbOK) {
		lbIPs = nil
		for i, a := range svc.LoadBalancerIPs {
			switch {
			case !familyOK(a):
			case hijackProblem(a) != "":
				b.problem(serviceObject(svc), "status.loadBalancer.ingress["+strconv.Itoa(i)+"].ip", a.String(), "refused: "+hijackProblem(a)+"; ignored")
			default:
				lbIPs = append(lbIPs, a)
			}
		}
	}

	sps := make([]*ServicePort, 0, len(svc.Ports))
	portIdx := make([]int, 0, len(svc.Ports)) // spec.ports index of sps[i]
	for i, ps := range svc.Ports {
		dup := false
		for _, j := range portIdx {
			q := svc.Ports[j]
			if q.Name == ps.Name && q.Protocol == ps.Protocol {
				b.problem(serviceObject(svc), "spec.ports["+strconv.Itoa(i)+"].name", ps.Name, "duplicate port name for protocol "+string(ps.Protocol)+"; port skipped")
				dup = true
			} else if q.Port == ps.Port && q.Protocol == ps.Protocol {
				b.problem(serviceObject(svc), "spec.ports["+strconv.Itoa(i)+"].port", strconv.Itoa(int(ps.Port)), "duplicate port for protocol "+string(ps.Protocol)+"; port skipped")
				dup = true
			}
			if dup {
				break
			}
		}
		if dup {
			continue
		}
		sp := &ServicePort{
			Name:                     ServicePortName{ServiceName: svc.ServiceName, Port: ps.Name, Protocol: ps.Protocol},
			Type:                     typ,
			ClusterIPs:               svc.ClusterIPs,
			Port:                     ps.Port,
			Protocol:                 ps.Protocol,
			NodePort:                 ps.NodePort,
			ExternalIPs:              externalIPs,
			LoadBalancerIPs:          lbIPs,
			LoadBalancerSourceRanges: svc.LoadBalancerSourceRanges,
			AffinityTimeoutSeconds:   svc.AffinityTimeoutSeconds,
			InternalTrafficPolicy:    policyOrCluster(svc.InternalTrafficPolicy),
			ExternalTrafficPolicy:    policyOrCluster(svc.ExternalTrafficPolicy),
			HealthCheckNodePort:      svc.HealthCheckNodePort,
			TrafficDistribution:      svc.TrafficDistribution,
			Balance:                  balance,
			OutlierEjection:          svc.OutlierEjection == "on" || (svc.OutlierEjection == "" && b.opts.OutlierEjection),
			SlowStart:                svc.SlowStart,
			DrainReset:               svc.DrainReset,
		}
		sp.QuietFlows = b.opts.QuietFlows && !sp.FlowsRead()
		sp.SampledFlows = b.opts.QuietFlows && sp.FlowsRead()
		sps = append(sps, sp)
		portIdx = append(portIdx, i)
	}
	if len(sps) == 0 {
		return nil
	}

	for len(b.cands) < len(sps) {
		b.cands = append(b.cands, nil)
	}
	cands := b.cands[:len(sps)] // writes to cands[i] keep the grown buffers
	for i := range cands {
		cands[i] = cands[i][:0]
	}
	rank := 0
	var valid []int // indices of usable endpoints of the current slice
	for _, si := range idx {
		sl := b.snap.Slices[si]
		var want func(netip.Addr) bool
		switch sl.AddressType {
		case IPv4:
			want = netip.Addr.Is4
		case IPv6:
			want = netip.Addr.Is6
		default:
			b.problem(sliceObject(svc.Namespace, sl.Name), "addressType", string(sl.AddressType), "must be IPv4 or IPv6; slice ignored")
			continue
		}
		if (sl.AddressType == IPv4 && !fam4) || (sl.AddressType == IPv6 && !fam6) {
			if len(svc.ClusterIPs) > 0 {
				b.problem(sliceObject(svc.Namespace, sl.Name), "addressType", string(sl.AddressType), "Service "+svc.ServiceName.String()+" has no ClusterIP of this family; slice ignored")
			}
			continue
		}
		valid = valid[:0]
		for k := range sl.Endpoints {
			se := &sl.Endpoints[k]
			if !se.Address.IsValid() {
				b.problem(sliceObject(svc.Namespace, sl.Name), "endpoints["+strconv.Itoa(k)+"].addresses", "", "no address; endpoint skipped")
				continue
			}
			a := se.Address
			if err := CheckEndpointIP(a); err != nil {
				b.problem(sliceObject(svc.Namespace, sl.Name), "endpoints["+strconv.Itoa(k)+"].addresses[0]", a.String(), "refused: "+err.Error())
				continue
			}
			if !want(a) {
				b.problem(sliceObject(svc.Namespace, sl.Name), "endpoints["+strconv.Itoa(k)+"].addresses[0]", a.String(), "not of addressType "+string(sl.AddressType)+"; endpoint skipped")
				continue
			}
			valid = append(valid, k)
		}
		for _, port := range sl.Ports {
			if port.Port == 0 {
				continue
			}
			pi := -1
			for i, sp := range sps {
				if sp.Name.Port == port.Name && sp.Protocol == port.Protocol {
					pi = i
					break
				}
			}
			if pi < 0 {
				continue
			}
			for _, k := range valid {
				se := &sl.Endpoints[k]
				a16 := se.Address.As16()
				cands[pi] = append(cands[pi], candidate{
					hi:    binary.BigEndian.Uint64(a16[:8]),
					lo:    binary.BigEndian.Uint64(a16[8:]),
					v6:    se.Address.Is6(),
					port:  port.Port,
					cond:  conditionRank(se.Ready, se.Serving, se.Terminating),
					rank:  int32(rank + k),
					slice: int32(si),
					ep:    int32(k),
				})
			}
		}
		rank += len(sl.Endpoints)
	}

	out := sps[:0]
	var seenProblem map[Problem]bool
	for i, sp := range sps {
		sp.Endpoints = b.mergeCandidates(cands[i], svc.TrafficDistribution)
		sp.ClusterEndpoints, sp.LocalEndpoints = CategorizeEndpoints(sp, b.nodeName, b.zone)
		if err := sp.Validate(); err != nil {
			for _, fe := range FieldErrors(err) {
				field := fe.Field
				if rest, ok := strings.CutPrefix(field, "spec.ports."); ok {
					field = "spec.ports[" + strconv.Itoa(portIdx[i]) + "]." + rest
				}
				p := Problem{Object: serviceObject(svc), Field: field, Value: fe.Value, Reason: fe.Reason + "; port " + sp.Name.String() + " skipped"}
				if seenProblem == nil {
					seenProblem = map[Problem]bool{}
				}
				if !seenProblem[p] {
					seenProblem[p] = true
					b.problems = append(b.problems, p)
				}
			}
			continue
		}
		out = append(out, sp)
	}
	return out
}

// conditionRank orders duplicate copies: ready, then serving, then not
// terminating (lower is better).
func conditionRank(ready, serving, terminating bool) uint8 {
	var r uint8
	if !ready {
		r += 4
	}
	if !serving {
		r += 2
	}
	if terminating {
		r++
	}
	return r
}

func serviceObject(svc *Service) string { return "Service " + svc.ServiceName.String() }

func sliceObject(namespace, name string) string { return "EndpointSlice " + namespace + "/" + name }

func policyOrCluster(p TrafficPolicy) TrafficPolicy {
	if p == "" {
		return PolicyCluster
	}
	return p
}

func compareServiceName(a, b ServiceName) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

func allFunc[T any](s []T, f func(T) bool) bool {
	for _, v := range s {
		if !f(v) {
			return false
		}
	}
	return true
}

func balanceList(bs []Balance) string {
	if len(bs) == 0 {
		return "none"
	}
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = string(b)
	}
	return strings.Join(out, ", ")
}
