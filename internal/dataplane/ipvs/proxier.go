// Package ipvs is vipproxy's IPVS mode: one IPVS virtual server per
// Service VIP:port (ClusterIP, externalIP, load-balancer IP) and per node
// address:NodePort, one real server per endpoint, the VIPs bound to an
// interface the mode owns, and a fixed set of iptables rules whose
// decisions (masquerade, loadBalancerSourceRanges, Local policies,
// no-endpoint reject, unknown-port reject) are ipset lookups.
//
// New probes the kernel and falls back to the iptables mode, with one
// warning and a metric, when IPVS or ipset is unusable. NewProxier builds
// the IPVS proxier without probing (for tests over fakes).
//
// Every OS boundary is an interface with a fake: Kernel (IPVS netlink),
// IPSet (ipset restore), iptables.Runner (iptables-restore), Addrs (VIP
// binding) and Sysctl.
package ipvs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/model"
)

// Options configure the IPVS mode. Every OS boundary is a field; nil
// means the real one in the calling thread's network namespace.
type Options struct {
	dataplane.Options
	// Kernel programs IPVS; nil means OpenNetlink().
	Kernel Kernel
	// IPSet runs ipset; nil means &IPSetExec{}.
	IPSet IPSet
	// Runner runs iptables-restore/-save; nil means &iptables.Exec{}.
	Runner iptables.Runner
	// Addrs binds VIPs; nil means &LinkAddrs{} (dummy interface where the
	// kernel has them, else labelled addresses on lo).
	Addrs Addrs
	// Sysctl writes the IPVS sysctls; nil means ProcSysctl{}.
	Sysctl Sysctl
	// Families are the IP families programmed; nil means IPv4 and IPv6.
	Families []iptables.Family
	// Timeouts are ipvs.tcpTimeout, tcpFinTimeout and udpTimeout; zero
	// fields leave the kernel's values.
	Timeouts Timeouts
	// StrictARP sets arp_ignore=1 and arp_announce=2 (ipvs.strictARP).
	StrictARP bool
	// ExcludeCIDRs protects virtual servers in these prefixes: vipproxy
	// never deletes them (ipvs.excludeCIDRs).
	ExcludeCIDRs []netip.Prefix
	// LocalAddrs returns the node's local addresses, for
	// NodePortAddresses; nil uses net.InterfaceAddrs.
	LocalAddrs func() ([]netip.Addr, error)
	// IPTables configures the iptables mode New falls back to; its
	// embedded dataplane.Options are replaced by Options.Options.
	IPTables iptables.Options
	// FlushLocal makes Cleanup delete the virtual servers on every local
	// address (as kube-proxy's --cleanup flushes IPVS), not only those on
	// vipproxy's VIPs, on NodeIPs and those this Proxier made. Set it for
	// `vipproxy --cleanup`, not for removing leftovers at start.
	FlushLocal bool
	// SkipMigration disables the removal, on the first Sync, of what the
	// other vipproxy modes left (the iptables mode's VIP- chains, the
	// nftables tables "vipproxy" and "kube-proxy"), whose DNAT rules would
	// otherwise catch Service traffic before IPVS sees it.
	SkipMigration bool
}

// Proxier implements dataplane.Dataplane with IPVS. Create it with New or
// NewProxier.
type Proxier struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	needFull bool
	// applied is what vipproxy believes the kernel holds: its virtual
	// servers and their real servers.
	applied map[ServiceKey]*appliedVS
	// pending holds real servers at weight 0 waiting for their TCP
	// connections to end (graceful termination).
	pending map[ServiceKey]map[netip.AddrPort]bool
	sets    setState
	bound   map[netip.Addr]bool
	npAddrs []netip.Addr
	// npGen counts changes of npAddrs; cached fragments of another
	// generation are rebuilt.
	npGen int
	cache map[model.ServicePortName]*cachedFragment

	// verifyNext is where Verify's window of real-server checks starts.
	verifyNext int

	migrated     bool
	sysctlsDone  bool
	timeoutsDone bool
	originals    map[string]string
}

type appliedVS struct {
	vs    VirtualServer
	dests map[netip.AddrPort]RealServer
}

var _ dataplane.Dataplane = (*Proxier)(nil)

// validate checks and defaults the options New and NewProxier share.
func validate(opts *Options) error {
	if opts.Scheduler == "" {
		opts.Scheduler = "rr"
	}
	if !validScheduler(opts.Scheduler) {
		return fmt.Errorf("ipvs: ipvs.scheduler %q is not one of %s", opts.Scheduler, strings.Join(Schedulers, ", "))
	}
	if opts.MasqueradeBit == 0 {
		opts.MasqueradeBit = 14
	}
	if opts.MasqueradeBit < 0 || opts.MasqueradeBit > 31 {
		return fmt.Errorf("ipvs: masqueradeBit %d is not in [0, 31]", opts.MasqueradeBit)
	}
	for name, d := range map[string]int64{"tcpTimeout": int64(opts.Timeouts.TCP), "tcpFinTimeout": int64(opts.Timeouts.TCPFin), "udpTimeout": int64(opts.Timeouts.UDP)} {
		if d < 0 {
			return fmt.Errorf("ipvs: ipvs.%s %d is negative", name, d)
		}
	}
	if opts.Families == nil {
		opts.Families = []iptables.Family{iptables.IPv4, iptables.IPv6}
	}
	if opts.IPSet == nil {
		opts.IPSet = &IPSetExec{}
	}
	if opts.Runner == nil {
		opts.Runner = &iptables.Exec{}
	}
	if opts.Addrs == nil {
		opts.Addrs = &LinkAddrs{}
	}
	if opts.Sysctl == nil {
		opts.Sysctl = ProcSysctl{}
	}
	if opts.LocalAddrs == nil {
		opts.LocalAddrs = interfaceAddrs
	}
	return nil
}

func interfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("ipvs: list local addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out, nil
}

// NewProxier validates opts and returns the IPVS proxier without probing.
// A nil Kernel is opened with OpenNetlink, whose failure is returned. It
// writes nothing to the kernel; the first Sync does.
func NewProxier(opts Options) (*Proxier, error) {
	if err := validate(&opts); err != nil {
		return nil, err
	}
	if opts.Kernel == nil {
		k, err := OpenNetlink()
		if err != nil {
			return nil, err
		}
		opts.Kernel = k
	}
	return &Proxier{
		opts:     opts,
		log:      opts.Log().With("mode", "ipvs"),
		needFull: true,
		applied:  map[ServiceKey]*appliedVS{},
		pending:  map[ServiceKey]map[netip.AddrPort]bool{},
		sets:     setState{},
		bound:    map[netip.Addr]bool{},
		cache:    map[model.ServicePortName]*cachedFragment{},
	}, nil
}

// Mode implements dataplane.Dataplane.
func (p *Proxier) Mode() string { return "ipvs" }

// SysctlOriginals returns the values the sysctls had before this Proxier
// changed them (only those it changed).
func (p *Proxier) SysctlOriginals() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]string, len(p.originals))
	for k, v := range p.originals {
		out[k] = v
	}
	return out
}

// PendingDeletions returns the real servers at weight 0 waiting for their
// connections to end, as "TCP/vip:port -> ep:port", sorted.
func (p *Proxier) PendingDeletions() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for k, m := range p.pending {
		for ap := range m {
			out = append(out, k.String()+" -> "+ap.String())
		}
	}
	slices.Sort(out)
	return out
}

// desiredVS is a wanted virtual server and its real servers.
type desiredVS struct {
	vs    VirtualServer
	dests map[netip.AddrPort]RealServer
}

// desired is the whole wanted state of one Sync.
type desired struct {
	vss  map[ServiceKey]*desiredVS
	sets setState
	vips map[netip.Addr]bool
}

func (p *Proxier) wantFamily(a netip.Addr) bool {
	return slices.Contains(p.opts.Families, familyOf(a))
}

// checkPort returns why sp cannot be programmed, or "".
func checkPort(sp *model.ServicePort) string {
	switch sp.Protocol {
	case model.TCP, model.UDP, model.SCTP:
	default:
		return fmt.Sprintf("protocol %q is not TCP, UDP or SCTP", sp.Protocol)
	}
	if sp.Port == 0 {
		return "port 0"
	}
	if sp.AffinityTimeoutSeconds < 0 || sp.AffinityTimeoutSeconds > model.MaxAffinityTimeoutSecs {
		return fmt.Sprintf("sessionAffinityConfig.clientIP.timeoutSeconds %d is not in [0, %d]", sp.AffinityTimeoutSeconds, model.MaxAffinityTimeoutSecs)
	}
	return ""
}

// setMember is one member of one set.
type setMember struct {
	fam  iptables.Family
	base string
	m    string
}

// fragVS is one virtual server of a ServicePort with the set members and
// the VIP that come with it.
type fragVS struct {
	dv      *desiredVS
	members []setMember
	vip     netip.Addr // bound when valid
}

// fragment is what one ServicePort contributes, cached across syncs
// while the ServicePort (as far as this mode reads it) and the NodePort
// addresses stay the same.
type fragment struct {
	in    portInput
	npGen int
	vss   []fragVS
	loop  []setMember
	bad   string // why the port is skipped, "" when it is not
}

// portInput is the part of a ServicePort the IPVS mode reads, in a form
// that can be compared without allocating.
type portInput struct {
	proto                     model.Protocol
	port, nodePort            uint16
	affinity                  int
	intLocal, extLocal        bool
	clusterIPs, extIPs, lbIPs []netip.Addr
	ranges                    []netip.Prefix
	intEPs, extEPs, reach     []netip.AddrPort
}

func addrPorts(eps []model.Endpoint) []netip.AddrPort {
	out := make([]netip.AddrPort, len(eps))
	for i, e := range eps {
		out[i] = netip.AddrPortFrom(e.IP, e.Port)
	}
	return out
}

func sameEPs(a []netip.AddrPort, b []model.Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	for i, e := range b {
		if a[i] != netip.AddrPortFrom(e.IP, e.Port) {
			return false
		}
	}
	return true
}

func inputOf(sp *model.ServicePort) portInput {
	return portInput{
		proto: sp.Protocol, port: sp.Port, nodePort: sp.NodePort, affinity: sp.AffinityTimeoutSeconds,
		intLocal: sp.InternalPolicyLocal(), extLocal: sp.ExternalPolicyLocal(),
		clusterIPs: slices.Clone(sp.ClusterIPs), extIPs: slices.Clone(sp.ExternalIPs), lbIPs: slices.Clone(sp.LoadBalancerIPs),
		ranges: slices.Clone(sp.LoadBalancerSourceRanges),
		intEPs: addrPorts(sp.InternalEndpoints()), extEPs: addrPorts(sp.ExternalEndpoints()), reach: addrPorts(sp.ReachableEndpoints()),
	}
}

// same reports whether sp reads as in.
func (in *portInput) same(sp *model.ServicePort) bool {
	return in.proto == sp.Protocol && in.port == sp.Port && in.nodePort == sp.NodePort && in.affinity == sp.AffinityTimeoutSeconds &&
		in.intLocal == sp.InternalPolicyLocal() && in.extLocal == sp.ExternalPolicyLocal() &&
		slices.Equal(in.clusterIPs, sp.ClusterIPs) && slices.Equal(in.extIPs, sp.ExternalIPs) && slices.Equal(in.lbIPs, sp.LoadBalancerIPs) &&
		slices.Equal(in.ranges, sp.LoadBalancerSourceRanges) &&
		sameEPs(in.intEPs, sp.InternalEndpoints()) && sameEPs(in.extEPs, sp.ExternalEndpoints()) && sameEPs(in.reach, sp.ReachableEndpoints())
}

// fragmentOf returns sp's fragment, from the cache when sp is unchanged.
func (p *Proxier) fragmentOf(sp *model.ServicePort) *fragment {
	if f := p.cache[sp.Name]; f != nil && f.npGen == p.npGen && f.in.same(sp) {
		f.seen = true
		return &f.fragment
	}
	f := &cachedFragment{fragment: p.newFragment(sp), seen: true}
	p.cache[sp.Name] = f
	return &f.fragment
}

type cachedFragment struct {
	fragment
	seen bool
}

// newFragment computes what sp contributes.
func (p *Proxier) newFragment(sp *model.ServicePort) fragment {
	f := fragment{in: inputOf(sp), npGen: p.npGen}
	if f.bad = checkPort(sp); f.bad != "" {
		return f
	}
	vs := VirtualServer{Scheduler: p.opts.Scheduler}
	if sp.AffinityTimeoutSeconds > 0 {
		vs.Flags, vs.Timeout = FlagPersistent, uint32(sp.AffinityTimeoutSeconds)
	}
	// addVS adds the virtual server ip:port over eps. local says a Local
	// policy applies (drop when eps is empty); bind binds ip; cluster and
	// clusterLocal name the sets for each policy.
	addVS := func(ip netip.Addr, port uint16, eps []model.Endpoint, local, bind bool, cluster, clusterLocal string) *fragVS {
		if !p.wantFamily(ip) {
			return nil
		}
		fam := familyOf(ip)
		v := vs
		v.ServiceKey = ServiceKey{Addr: ip, Port: port, Protocol: sp.Protocol}
		fv := fragVS{dv: &desiredVS{vs: v, dests: map[netip.AddrPort]RealServer{}}}
		for _, e := range eps {
			if e.IP.Is4() != ip.Is4() {
				continue
			}
			rs := RealServer{Addr: e.IP, Port: e.Port, Weight: 1}
			fv.dv.dests[rs.AddrPort()] = rs
		}
		m := member(ip, sp.Protocol, port)
		add := func(base, m string) { fv.members = append(fv.members, setMember{fam, base, m}) }
		if local {
			add(clusterLocal, m)
		} else {
			add(cluster, m)
		}
		if len(fv.dv.dests) == 0 {
			if local {
				add(setDrop, m)
			} else {
				add(setReject, m)
			}
		}
		if bind {
			fv.vip = ip
		}
		if cluster == setClusterIP {
			// Unknown ports are rejected on ClusterIPs only: an
			// externalIP or LB IP may be an address of a host whose
			// other services must stay reachable.
			add(setVIPs, ip.String())
		}
		f.vss = append(f.vss, fv)
		return &f.vss[len(f.vss)-1]
	}
	intEPs, extEPs := sp.InternalEndpoints(), sp.ExternalEndpoints()
	extLocal := sp.ExternalPolicyLocal()
	for _, ip := range sp.ClusterIPs {
		addVS(ip, sp.Port, intEPs, sp.InternalPolicyLocal(), true, setClusterIP, setClusterIP)
	}
	for _, ip := range sp.ExternalIPs {
		addVS(ip, sp.Port, extEPs, extLocal, true, setExternal, setExternalLocal)
	}
	for _, ip := range sp.LoadBalancerIPs {
		fv := addVS(ip, sp.Port, extEPs, extLocal, true, setLB, setLBLocal)
		if fv == nil || len(sp.LoadBalancerSourceRanges) == 0 {
			continue
		}
		fam := familyOf(ip)
		m := member(ip, sp.Protocol, sp.Port)
		fv.members = append(fv.members, setMember{fam, setLBFW, m})
		for _, r := range sp.LoadBalancerSourceRanges {
			if r.Addr().Is4() == ip.Is4() {
				fv.members = append(fv.members, setMember{fam, setLBSrc, m + "," + r.Masked().String()})
			}
		}
	}
	if sp.NodePort != 0 {
		for _, ip := range p.npAddrs {
			// NodePorts only in the families of the Service.
			if len(sp.ClusterIPs) > 0 && !slices.ContainsFunc(sp.ClusterIPs, func(c netip.Addr) bool { return c.Is4() == ip.Is4() }) {
				continue
			}
			addVS(ip, sp.NodePort, extEPs, extLocal, false, setNodePort, setNodePortLocal)
		}
	}
	for _, e := range sp.ReachableEndpoints() {
		if p.wantFamily(e.IP) {
			f.loop = append(f.loop, setMember{familyOf(e.IP), setLoopBack, fmt.Sprintf("%s,%s:%d,%s", e.IP, protoLower(sp.Protocol), e.Port, e.IP)})
		}
	}
	return f
}

// build computes the wanted virtual servers, set members and VIPs from
// the (cached) fragments of st's ports. A ServicePort that cannot be
// programmed, or whose VIP:port another ServicePort already holds, is
// skipped with a warning.
func (p *Proxier) build(st *model.State) *desired {
	d := &desired{vss: map[ServiceKey]*desiredVS{}, sets: setState{}, vips: map[netip.Addr]bool{}}
	for _, f := range p.cache {
		f.seen = false
	}
	for _, sp := range st.Ports {
		f := p.fragmentOf(sp)
		if f.bad != "" {
			p.log.Warn("skipping Service port", "servicePort", sp.Name.String(), "reason", f.bad)
			continue
		}
		for _, fv := range f.vss {
			k := fv.dv.vs.ServiceKey
			if _, dup := d.vss[k]; dup {
				p.log.Warn("skipping Service address: another Service port already uses it", "servicePort", sp.Name.String(), "virtualServer", k.String())
				continue
			}
			d.vss[k] = fv.dv
			for _, m := range fv.members {
				d.sets.add(m.fam, m.base, m.m)
			}
			if fv.vip.IsValid() {
				d.vips[fv.vip] = true
			}
		}
		for _, m := range f.loop {
			d.sets.add(m.fam, m.base, m.m)
		}
	}
	for name, f := range p.cache {
		if !f.seen {
			delete(p.cache, name)
		}
	}
	return d
}

// nodePortAddrs returns the addresses NodePort virtual servers listen on:
// the node IPs, or the local addresses inside NodePortAddresses.
func (p *Proxier) nodePortAddrs() ([]netip.Addr, error) {
	if len(p.opts.NodePortAddresses) == 0 {
		return slices.Clone(p.opts.NodeIPs), nil
	}
	local, err := p.opts.LocalAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range local {
		if a.IsLoopback() || p.bound[a] {
			continue
		}
		for _, pre := range p.opts.NodePortAddresses {
			if pre.Contains(a) {
				out = append(out, a)
				break
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

func (p *Proxier) excluded(a netip.Addr) bool {
	for _, c := range p.opts.ExcludeCIDRs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}

// ours reports whether a kernel virtual server belongs to vipproxy: its
// address is a VIP vipproxy bound or a NodePort address, and it is not in
// ExcludeCIDRs.
func (p *Proxier) ours(a netip.Addr) bool {
	if p.excluded(a) {
		return false
	}
	return p.bound[a] || slices.Contains(p.npAddrs, a)
}

// readKernel rebuilds bound, applied and pending from the kernel: every virtual
// server that is ours (see ours) or that this Proxier made.
func (p *Proxier) readKernel() error {
	addrs, err := p.opts.Addrs.List()
	if err != nil {
		return err
	}
	p.bound = map[netip.Addr]bool{}
	for _, a := range addrs {
		p.bound[a] = true
	}
	svcs, err := p.opts.Kernel.Services()
	if err != nil {
		return err
	}
	// Addresses of virtual servers this Proxier made stay its own even
	// when they are no NodePort address any more.
	made := map[netip.Addr]bool{}
	for k := range p.applied {
		made[k.Addr] = true
	}
	p.applied = map[ServiceKey]*appliedVS{}
	p.pending = map[ServiceKey]map[netip.AddrPort]bool{}
	for _, vs := range svcs {
		if !p.ours(vs.Addr) && !made[vs.Addr] {
			continue
		}
		ds, err := p.opts.Kernel.Destinations(vs.ServiceKey)
		if err != nil {
			return err
		}
		a := &appliedVS{vs: vs, dests: map[netip.AddrPort]RealServer{}}
		for _, rs := range ds {
			a.dests[rs.AddrPort()] = rs
		}
		p.applied[vs.ServiceKey] = a
	}
	return nil
}

// emptyPruner is the optional iptables.Runner method that deletes a
// table's built-in chains when no rule is left in them (iptables.Exec on
// the nft backend).
type emptyPruner interface {
	PruneEmpty(ctx context.Context, fam iptables.Family, table string) (bool, error)
}

// graceful reports whether real servers of proto are drained before they
// are deleted. As in kube-proxy, UDP and SCTP real servers are deleted at
// once (expire_nodest_conn ends their flows on the next packet).
func graceful(proto model.Protocol) bool { return proto == model.TCP }

func sortedAPs[V any](m map[netip.AddrPort]V) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}

func sortedKeysVS[V any](m map[ServiceKey]V) []ServiceKey {
	out := make([]ServiceKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b ServiceKey) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), strings.Compare(string(a.Protocol), string(b.Protocol)))
	})
	return out
}

// syncVS makes one virtual server and its real servers match d.
func (p *Proxier) syncVS(d *desiredVS) error {
	k := d.vs.ServiceKey
	cur := p.applied[k]
	var errs []error
	if cur == nil {
		err := p.opts.Kernel.AddService(d.vs)
		cur = &appliedVS{vs: d.vs, dests: map[netip.AddrPort]RealServer{}}
		if IsExist(err) {
			// Someone else's, or ours from before a partial view: adopt it.
			if err = p.opts.Kernel.UpdateService(d.vs); err == nil {
				ds, lerr := p.opts.Kernel.Destinations(k)
				err = lerr
				for _, rs := range ds {
					cur.dests[rs.AddrPort()] = rs
				}
			}
		}
		if err != nil {
			return err
		}
		p.applied[k] = cur
	} else if !cur.vs.equal(d.vs) {
		if err := p.opts.Kernel.UpdateService(d.vs); err != nil {
			return err
		}
		cur.vs = d.vs
	} else if sameDests(cur.dests, d.dests) {
		return nil // the common case of a partial sync: nothing to do
	}
	for _, ap := range sortedAPs(d.dests) {
		rs := d.dests[ap]
		have, ok := cur.dests[ap]
		switch {
		case !ok:
			if err := p.opts.Kernel.AddDest(k, rs); err != nil {
				errs = append(errs, err)
				continue
			}
			cur.dests[ap] = rs
		case have.Weight != rs.Weight:
			if err := p.opts.Kernel.UpdateDest(k, rs); err != nil {
				errs = append(errs, err)
				continue
			}
			have.Weight = rs.Weight
			cur.dests[ap] = have
		}
		delete(p.pending[k], ap)
	}
	for _, ap := range sortedAPs(cur.dests) {
		if _, ok := d.dests[ap]; ok {
			continue
		}
		have := cur.dests[ap]
		if !graceful(k.Protocol) {
			if err := p.opts.Kernel.DelDest(k, have); err != nil && !IsNotFound(err) {
				errs = append(errs, err)
				continue
			}
			delete(cur.dests, ap)
			continue
		}
		if have.Weight != 0 {
			have.Weight = 0
			if err := p.opts.Kernel.UpdateDest(k, have); err != nil {
				errs = append(errs, err)
				continue
			}
			cur.dests[ap] = have
		}
		if p.pending[k] == nil {
			p.pending[k] = map[netip.AddrPort]bool{}
		}
		p.pending[k][ap] = true
	}
	return errors.Join(errs...)
}

// sameDests reports whether the applied real servers are exactly the
// wanted ones with the wanted weights (then none is pending either).
func sameDests(have, want map[netip.AddrPort]RealServer) bool {
	if len(have) != len(want) {
		return false
	}
	for ap, w := range want {
		h, ok := have[ap]
		if !ok || h.Weight != w.Weight {
			return false
		}
	}
	return true
}

// reapPending deletes the real servers at weight 0 that hold no active
// or inactive connection any more.
func (p *Proxier) reapPending() error {
	var errs []error
	for _, k := range sortedKeysVS(p.pending) {
		aps := p.pending[k]
		cur := p.applied[k]
		if cur == nil || len(aps) == 0 {
			delete(p.pending, k)
			continue
		}
		ds, err := p.opts.Kernel.Destinations(k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		inKernel := map[netip.AddrPort]RealServer{}
		for _, rs := range ds {
			inKernel[rs.AddrPort()] = rs
		}
		for _, ap := range sortedAPs(aps) {
			rs, ok := inKernel[ap]
			if ok && rs.ActiveConn+rs.InactiveConn > 0 {
				continue
			}
			if ok {
				if err := p.opts.Kernel.DelDest(k, rs); err != nil && !IsNotFound(err) {
					errs = append(errs, err)
					continue
				}
				p.log.Debug("real server drained and deleted", "virtualServer", k.String(), "realServer", ap.String())
			}
			delete(cur.dests, ap)
			delete(aps, ap)
		}
		if len(aps) == 0 {
			delete(p.pending, k)
		}
	}
	return errors.Join(errs...)
}

// setSysctls writes the IPVS sysctls, recording the original values of
// those it changes.
func (p *Proxier) setSysctls() error {
	var errs []error
	if p.originals == nil {
		p.originals = map[string]string{}
	}
	for _, s := range sysctls(p.opts.StrictARP) {
		old, err := p.opts.Sysctl.Read(s.name)
		if err == nil && old == s.value {
			continue
		}
		if err := p.opts.Sysctl.Write(s.name, s.value); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, seen := p.originals[s.name]; !seen && old != "" {
			p.originals[s.name] = old
		}
	}
	return errors.Join(errs...)
}

// Sync implements dataplane.Dataplane. A full sync (asked for, first,
// or after a failure) reads vipproxy's virtual servers and bound VIPs
// back from the kernel, rewrites every ipset through a swap and rewrites
// the iptables chains; a partial sync touches only the virtual servers,
// real servers, VIPs and set members that changed, and no iptables rule.
// Every sync deletes drained real servers. Errors of single objects do
// not stop the others; any error makes the next sync full.
func (p *Proxier) Sync(ctx context.Context, st *model.State, full bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st == nil {
		st = &model.State{}
	}
	if p.needFull {
		full = true
	}
	if !full {
		if reason := p.rulesGone(ctx); reason != "" {
			p.log.Warn("vipproxy IPVS-mode rules were removed; doing a full sync", "reason", reason)
			full = true
		}
	}
	var errs []error
	if !p.migrated && !p.opts.SkipMigration {
		p.migrate(ctx)
	}
	p.migrated = true
	if !p.sysctlsDone {
		if err := p.setSysctls(); err != nil {
			errs = append(errs, err)
		} else {
			p.sysctlsDone = true
		}
	}
	if !p.timeoutsDone {
		if t := p.opts.Timeouts; t != (Timeouts{}) {
			if err := p.opts.Kernel.SetTimeouts(t); err != nil {
				errs = append(errs, err)
			} else {
				p.timeoutsDone = true
			}
		} else {
			p.timeoutsDone = true
		}
	}
	if full {
		p.bound = map[netip.Addr]bool{}
		if addrs, err := p.opts.Addrs.List(); err == nil {
			for _, a := range addrs {
				p.bound[a] = true
			}
		}
		np, err := p.nodePortAddrs()
		if err != nil {
			errs = append(errs, err)
		} else if !slices.Equal(np, p.npAddrs) {
			p.npAddrs = np
			p.npGen++
		}
		if err := p.readKernel(); err != nil {
			p.needFull = true
			return errors.Join(append(errs, fmt.Errorf("ipvs: read kernel state: %w", err))...)
		}
	}
	d := p.build(st)
	for _, ip := range sortedAddrs(d.vips) {
		if !p.bound[ip] {
			if err := p.opts.Addrs.Add(ip); err != nil {
				errs = append(errs, err)
				continue
			}
			p.bound[ip] = true
		}
	}
	for _, k := range sortedKeysVS(d.vss) {
		if err := p.syncVS(d.vss[k]); err != nil {
			errs = append(errs, err)
			p.log.Warn("virtual server not fully programmed", "virtualServer", k.String(), "err", err)
		}
	}
	for _, k := range sortedKeysVS(p.applied) {
		if _, ok := d.vss[k]; ok {
			continue
		}
		if err := p.opts.Kernel.DelService(k); err != nil && !IsNotFound(err) {
			errs = append(errs, err)
			continue
		}
		delete(p.applied, k)
		delete(p.pending, k)
	}
	if err := p.reapPending(); err != nil {
		errs = append(errs, err)
	}
	for _, ip := range sortedAddrs(p.bound) {
		if !d.vips[ip] {
			if err := p.opts.Addrs.Del(ip); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(p.bound, ip)
		}
	}
	for _, fam := range p.opts.Families {
		var script []byte
		if full {
			script = setsFull(fam, d.sets[fam])
		} else {
			script = setsDiff(fam, p.sets[fam], d.sets[fam])
		}
		if script == nil {
			continue
		}
		if err := p.opts.IPSet.Restore(ctx, script); err != nil {
			errs = append(errs, err)
			continue
		}
		p.sets[fam] = d.sets[fam]
	}
	if full {
		for _, fam := range p.opts.Families {
			for _, table := range tables {
				saved, err := p.opts.Runner.Save(ctx, fam, table)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				if err := p.opts.Runner.Restore(ctx, fam, table, p.rulesInput(fam, table, saved)); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if len(errs) > 0 {
		p.needFull = true
		err := errors.Join(errs...)
		p.log.Error("ipvs sync failed; next sync is full", "full", full, "err", err)
		return err
	}
	p.needFull = false
	return nil
}

// migrate removes the other modes' rules; failures are logged, not
// returned (the IPVS rules do not depend on it).
func (p *Proxier) migrate(ctx context.Context) {
	ipt, err := iptables.New(iptables.Options{Options: p.opts.Options, Runner: p.opts.Runner, Families: p.opts.Families, SkipMigration: true})
	if err == nil {
		err = ipt.Cleanup(ctx)
	}
	if err != nil {
		p.log.Warn("could not remove the iptables mode's rules", "err", err)
	}
	for _, fam := range p.opts.Families {
		for _, name := range []string{"vipproxy", "kube-proxy"} {
			if err := p.opts.Runner.DeleteNFTTable(ctx, fam, name); err != nil {
				p.log.Warn("could not delete nftables table", "family", fam.String(), "table", name, "err", err)
			}
		}
	}
}

// rulesGone returns why the last full sync's iptables rules are no longer
// in place (a chain is missing in some family, e.g. after iptables -F/-X
// or a firewall reload), or "" when they are. It lists one chain per
// family; an error other than "not found" counts as present (the periodic
// full sync repairs the rest).
func (p *Proxier) rulesGone(ctx context.Context) string {
	for _, fam := range p.opts.Families {
		if _, err := p.opts.Runner.ListChain(ctx, fam, iptables.TableFilter, chainFilter); iptables.IsNotFound(err) {
			return fmt.Sprintf("%s chain %s missing", fam, chainFilter)
		}
	}
	return ""
}

func sortedAddrs(m map[netip.Addr]bool) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// Cleanup implements dataplane.Dataplane. It deletes the virtual servers
// on vipproxy's VIPs, on NodeIPs, those it made, and with FlushLocal
// those on every local address, except those in ExcludeCIDRs; unbinds the VIPs (and
// deletes the dummy interface); removes the VIPVS- iptables chains and the
// jumps to them; destroys the VIPVS-/VIPVS6- ipsets; and puts back the
// sysctls this Proxier changed. It succeeds when there is nothing to remove.
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return cleanup(ctx, &p.opts, p.applied, p.originals)
}

func cleanup(ctx context.Context, o *Options, applied map[ServiceKey]*appliedVS, originals map[string]string) error {
	var errs []error
	if o.Kernel != nil {
		owned := map[netip.Addr]bool{}
		if addrs, err := o.Addrs.List(); err == nil {
			for _, a := range addrs {
				owned[a] = true
			}
		} else {
			errs = append(errs, err)
		}
		for _, a := range o.NodeIPs {
			owned[a] = true
		}
		if o.FlushLocal {
			if local, err := o.LocalAddrs(); err == nil {
				for _, a := range local {
					owned[a] = true
				}
			}
		}
		for k := range applied {
			owned[k.Addr] = true
		}
		svcs, err := o.Kernel.Services()
		if err != nil {
			errs = append(errs, err)
		}
		for _, vs := range svcs {
			if !owned[vs.Addr] || slices.ContainsFunc(o.ExcludeCIDRs, func(c netip.Prefix) bool { return c.Contains(vs.Addr) }) {
				continue
			}
			if err := o.Kernel.DelService(vs.ServiceKey); err != nil && !IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	if err := o.Addrs.Cleanup(); err != nil {
		errs = append(errs, err)
	}
	for _, fam := range o.Families {
		for _, table := range tables {
			// iptables-save of a table another mode filled with 10,000s of
			// rules takes seconds; skip tables where none of our chains is.
			if !anyChain(ctx, o.Runner, fam, table, ownChains[table]) {
				continue
			}
			saved, err := o.Runner.Save(ctx, fam, table)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if in := cleanupInput(table, saved); in != nil {
				if err := o.Runner.Restore(ctx, fam, table, in); err != nil {
					errs = append(errs, err)
					continue
				}
			}
			// iptables-nft created the table and its built-in chains for
			// our rules; left empty, they go too (as in iptables mode), so
			// the nftables ruleset is as before vipproxy ran.
			if d, ok := o.Runner.(emptyPruner); ok {
				if _, err := d.PruneEmpty(ctx, fam, table); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if names, err := o.IPSet.List(ctx); err != nil {
		if !errors.Is(err, exec.ErrNotFound) { // no ipset binary: no sets
			errs = append(errs, err)
		}
	} else {
		var b strings.Builder
		for _, n := range names {
			if strings.HasPrefix(n, SetPrefix) || strings.HasPrefix(n, SetPrefix6) {
				b.WriteString("destroy " + n + "\n")
			}
		}
		if b.Len() > 0 {
			if err := o.IPSet.Restore(ctx, []byte(b.String())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(originals)) {
		if err := o.Sysctl.Write(name, originals[name]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// anyChain reports whether one of chains exists in table (an error other
// than "not found" counts as existing, so the caller looks closer).
func anyChain(ctx context.Context, r iptables.Runner, fam iptables.Family, table string, chains []string) bool {
	for _, c := range chains {
		if _, err := r.ListChain(ctx, fam, table, c); err == nil || !iptables.IsNotFound(err) {
			return true
		}
	}
	return false
}
