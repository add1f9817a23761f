package nftables

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/netip"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/model"
)

// ruleset is the desired (or last applied) content of one family's table,
// apart from the fixed base chains.
type ruleset struct {
	// chains maps every regular chain to its rules.
	chains map[string][]string
	// affinity maps each ClientIP-affinity set to its timeout in seconds.
	affinity map[string]int
	// elems maps a static map or set name to its elements (key → value;
	// value "" for sets).
	elems map[string]map[string]string

	// Bookkeeping for in-place updates: each port's fragment, users of
	// shared chains, sets and set elements, owners of map keys.
	ports     map[model.ServicePortName]*portEntry
	chainRefs map[string]int
	affRefs   map[string]int
	elemRefs  map[elemID]int
	owners    map[elemID]*model.ServicePortName // points into ports' entries
	// waiting lists, per map key, ports that were refused the key because
	// another port owned it; the first one still present gets it when the
	// owner lets go.
	waiting map[elemID][]*portEntry
}

func newRuleset() *ruleset {
	return &ruleset{chains: map[string][]string{}, affinity: map[string]int{}, elems: map[string]map[string]string{},
		ports: map[model.ServicePortName]*portEntry{}, chainRefs: map[string]int{}, affRefs: map[string]int{},
		elemRefs: map[elemID]int{}, owners: map[elemID]*model.ServicePortName{}, waiting: map[elemID][]*portEntry{}}
}

// family holds what the layout of one family needs from Options.
type family struct {
	fam knftables.Family
	ip  string // "ip" or "ip6"
	is6 bool
	// fromPod and notFromPod match local (pod) traffic and the rest, by
	// source CIDR or incoming interface (Options.PodInterface); "" when
	// local traffic is not detected.
	fromPod, notFromPod string
	npMatch             string // match for NodePort addresses, "" when none
	svcCIDRs            string // anonymous set of service CIDRs, "" when none
	mark                string // masquerade mark as hex
	markVal             uint32
}

func (f *family) has(a netip.Addr) bool { return a.IsValid() && a.Unmap().Is6() == f.is6 }

func anonSet(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	return "{ " + strings.Join(items, ", ") + " }"
}

func prefixString(p netip.Prefix) string {
	p = p.Masked()
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// newFamily derives the per-family layout parameters from o.
func newFamily(fam knftables.Family, o *dataplane.Options) *family {
	f := &family{fam: fam, ip: "ip", is6: fam == knftables.IPv6Family}
	if f.is6 {
		f.ip = "ip6"
	}
	f.markVal = masqMark(o)
	f.mark = fmt.Sprintf("0x%x", f.markVal)
	var pods, svcs, nps []string
	for _, p := range o.ClusterCIDRs {
		if f.has(p.Addr()) {
			pods = append(pods, prefixString(p))
		}
	}
	for _, p := range o.ServiceCIDRs {
		if f.has(p.Addr()) {
			svcs = append(svcs, prefixString(p))
		}
	}
	if len(o.NodePortAddresses) > 0 {
		for _, p := range o.NodePortAddresses {
			if f.has(p.Addr()) {
				nps = append(nps, prefixString(p))
			}
		}
	} else {
		for _, a := range o.NodeIPs {
			if f.has(a) && !a.IsLoopback() {
				nps = append(nps, a.Unmap().String())
			}
		}
	}
	f.svcCIDRs = anonSet(svcs)
	switch {
	case o.PodInterface != "":
		name := o.PodInterface
		if o.PodInterfacePrefix {
			name += "*"
		}
		f.fromPod, f.notFromPod = `iifname "`+name+`"`, `iifname != "`+name+`"`
	case len(pods) > 0:
		set := anonSet(pods)
		f.fromPod, f.notFromPod = f.ip+" saddr "+set, f.ip+" saddr != "+set
	}
	if len(nps) > 0 {
		loop := "127.0.0.0/8"
		if f.is6 {
			loop = "::1"
		}
		f.npMatch = "fib daddr type local " + f.ip + " daddr != " + loop
		all := false
		for _, p := range nps {
			all = all || strings.HasSuffix(p, "/0")
		}
		if !all {
			f.npMatch += " " + f.ip + " daddr " + anonSet(nps)
		}
	}
	return f
}

func masqMark(o *dataplane.Options) uint32 {
	bit := o.MasqueradeBit
	if bit <= 0 || bit > 31 {
		bit = 14
	}
	return 1 << uint(bit)
}

// builder turns a State into one ruleset per family.
type builder struct {
	opts *dataplane.Options
	log  *slog.Logger
	fams []*family
	// cache holds the fragments of the last build by port fingerprint.
	cache map[knftables.Family]map[uint64]*frag
	buf   []byte
	seed  maphash.Seed
	// prevPorts and prevFps are the ports and fingerprints of the last
	// fingerprints call.
	prevPorts []*model.ServicePort
	prevFps   []uint64
	// last is the last full build (only its sizes are read).
	last map[knftables.Family]*ruleset
}

func newBuilder(o *dataplane.Options) *builder {
	b := &builder{opts: o, log: o.Log(), cache: map[knftables.Family]map[uint64]*frag{}, seed: maphash.MakeSeed()}
	for _, fam := range families {
		b.fams = append(b.fams, newFamily(fam, o))
	}
	return b
}

// build returns the desired ruleset of every family, built from scratch
// (fragments of unchanged ports come from the cache). Ports it cannot
// program (zero port, unknown protocol, address conflicts) are skipped
// with a log line; they never affect the other ports.
func (b *builder) build(st *model.State, fps []uint64) map[knftables.Family]*ruleset {
	out := map[knftables.Family]*ruleset{}
	for _, f := range b.fams {
		rs := newRuleset()
		// Size the maps like last time: growing maps of 10^5 entries
		// was a large part of a full sync.
		if prev := b.last[f.fam]; prev != nil {
			rs.chains = make(map[string][]string, len(prev.chains))
			rs.ports = make(map[model.ServicePortName]*portEntry, len(prev.ports))
			rs.chainRefs = make(map[string]int, len(prev.chainRefs))
			rs.elemRefs = make(map[elemID]int, len(prev.elemRefs))
			rs.owners = make(map[elemID]*model.ServicePortName, len(prev.owners))
		}
		for name, rules := range staticChains(f.ip, f.npMatch, f.svcCIDRs, f.markVal) {
			rs.chains[name] = rules
		}
		for _, m := range staticMaps(f.ip) {
			rs.elems[m.name] = make(map[string]string, b.lastLen(f.fam, m.name))
		}
		for _, s := range staticSets(f.ip) {
			rs.elems[s.name] = make(map[string]string, b.lastLen(f.fam, s.name))
		}
		cache := make(map[uint64]*frag, len(b.cache[f.fam]))
		if st != nil {
			// Fragments first, so that on a first build the maps can be
			// sized from what they will hold.
			frags := b.fragments(f, st.Ports, fps)
			sizes := map[string]int{}
			owned, shared := 0, 0
			for i, sp := range st.Ports {
				if sp == nil {
					continue
				}
				fr := frags[i]
				cache[fps[i]] = fr
				if b.last[f.fam] == nil {
					for _, e := range fr.elems {
						sizes[e.name]++
						if e.owned {
							owned++
						} else {
							shared++
						}
					}
				}
			}
			if b.last[f.fam] == nil {
				for name, n := range sizes {
					rs.elems[name] = make(map[string]string, n)
				}
				rs.ports = make(map[model.ServicePortName]*portEntry, len(st.Ports))
				rs.owners = make(map[elemID]*model.ServicePortName, owned)
				rs.elemRefs = make(map[elemID]int, shared)
			}
			for i, sp := range st.Ports {
				if sp == nil {
					continue
				}
				pe := &portEntry{name: sp.Name, fp: fps[i], fr: frags[i]}
				rs.ports[sp.Name] = pe
				rs.add(pe, b.log, nil)
			}
		}
		b.cache[f.fam] = cache
		out[f.fam] = rs
	}
	b.last = out
	return out
}

// lastLen is the size of a map or set in the last build.
func (b *builder) lastLen(f knftables.Family, name string) int {
	if prev := b.last[f]; prev != nil {
		return len(prev.elems[name])
	}
	return 0
}

// fingerprints returns a 64-bit hash of each port's fingerprint (0 for a
// nil port), computed once per sync and shared by both families. States
// are read-only (see dataplane.Dataplane.Sync) and model.Builder hands
// unchanged Services' ServicePorts on as the same pointers, so a port
// pointer of the previous call keeps its fingerprint: at 10,000 Services
// a change then hashes one port, not 10,000.
func (b *builder) fingerprints(st *model.State) []uint64 {
	if st == nil {
		b.prevPorts, b.prevFps = nil, nil
		return nil
	}
	out := make([]uint64, len(st.Ports))
	var byPtr map[*model.ServicePort]uint64
	for i, sp := range st.Ports {
		if sp == nil {
			continue
		}
		if i < len(b.prevPorts) && b.prevPorts[i] == sp {
			out[i] = b.prevFps[i]
			continue
		}
		if byPtr == nil && len(b.prevPorts) > 0 {
			// Ports moved (one added or removed before them): index the
			// previous call once.
			byPtr = make(map[*model.ServicePort]uint64, len(b.prevPorts))
			for j, p := range b.prevPorts {
				if p != nil {
					byPtr[p] = b.prevFps[j]
				}
			}
		}
		if fp, ok := byPtr[sp]; ok {
			out[i] = fp
			continue
		}
		b.buf = fingerprint(b.buf[:0], sp)
		out[i] = maphash.Bytes(b.seed, b.buf)
	}
	b.prevPorts, b.prevFps = st.Ports, out
	return out
}

// parallelFrom is the number of ports from which fragments is worth
// spreading over the CPUs.
var parallelFrom = 2000

// fragments returns the fragment of each port (nil for a nil port). Many
// ports are split over GOMAXPROCS goroutines: fragments are independent,
// and fragment only reads the builder (the cache is not written until all
// are made).
func (b *builder) fragments(f *family, ports []*model.ServicePort, fps []uint64) []*frag {
	out := make([]*frag, len(ports))
	one := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			if ports[i] != nil {
				_, out[i] = b.fragment(f, ports[i], fps[i])
			}
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(ports)/parallelFrom)
	if workers < 2 {
		one(0, len(ports))
		return out
	}
	var wg sync.WaitGroup
	chunk := (len(ports) + workers - 1) / workers
	for lo := 0; lo < len(ports); lo += chunk {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			one(lo, hi)
		}(lo, min(lo+chunk, len(ports)))
	}
	wg.Wait()
	return out
}

// fragment returns sp's fragment for family f, from the cache when sp did
// not change. It only reads b, so it may run concurrently with itself.
func (b *builder) fragment(f *family, sp *model.ServicePort, fp uint64) (uint64, *frag) {
	if fr := b.cache[f.fam][fp]; fr != nil {
		return fp, fr
	}
	w := &portWriter{b: b, f: f, fr: newFrag()}
	// Room for the usual elements (endpoint and hairpin per endpoint, a
	// few per address), so that appends rarely grow the slice.
	w.fr.elems = make([]fragElem, 0, 2*len(sp.Endpoints)+4*(len(sp.ClusterIPs)+len(sp.ExternalIPs)+len(sp.LoadBalancerIPs))+4)
	w.port(sp)
	if cap(w.fr.elems) > 2*len(w.fr.elems)+8 {
		w.fr.elems = slices.Clone(w.fr.elems) // cached: do not keep the slack
	}
	return fp, w.fr
}

// update brings rs (the last applied ruleset of family f, built from the
// ports prev) to st in place, touching only ports whose fingerprint
// changed, and records in tr what each touched object was before. A port
// that is the same pointer at the same index as in prev is unchanged
// (States are read-only) and costs no lookup.
func (b *builder) update(f *family, rs *ruleset, st *model.State, fps []uint64, prev []*model.ServicePort, tr *tracker) {
	type change struct {
		sp *model.ServicePort
		fp uint64
		fr *frag
	}
	var changes []change
	kept := 0 // ports of rs still in st
	if st != nil {
		for i, sp := range st.Ports {
			if sp == nil {
				continue
			}
			if i < len(prev) && prev[i] == sp {
				kept++
				continue
			}
			old, ok := rs.ports[sp.Name]
			if ok {
				kept++
				if old.fp == fps[i] {
					continue
				}
			}
			fp, fr := b.fragment(f, sp, fps[i])
			changes = append(changes, change{sp, fp, fr})
		}
	}
	// Removals first, so that an address moving between ports is free
	// when its new owner is added. (Names are unique in a State, so when
	// every port of rs was found, none is gone.)
	var gone []model.ServicePortName
	if kept < len(rs.ports) {
		seen := map[model.ServicePortName]bool{}
		if st != nil {
			for _, sp := range st.Ports {
				if sp != nil {
					seen[sp.Name] = true
				}
			}
		}
		for name := range rs.ports {
			if !seen[name] {
				gone = append(gone, name)
			}
		}
	}
	for _, name := range gone {
		old := rs.ports[name]
		rs.remove(old, tr)
		delete(rs.ports, name)
		delete(b.cache[f.fam], old.fp)
	}
	for _, c := range changes {
		if old, ok := rs.ports[c.sp.Name]; ok {
			rs.remove(old, tr)
			delete(b.cache[f.fam], old.fp)
		}
	}
	for _, c := range changes {
		pe := &portEntry{name: c.sp.Name, fp: c.fp, fr: c.fr}
		rs.ports[c.sp.Name] = pe
		rs.add(pe, b.log, tr)
		b.cache[f.fam][c.fp] = c.fr
	}
}

// frag is everything one ServicePort contributes to one family's ruleset.
// Fragments are cached by the port's fingerprint, so an unchanged port
// costs a fingerprint, not a rebuild.
type frag struct {
	chains   map[string][]string
	affinity map[string]int
	elems    []fragElem
}

type fragElem struct {
	name, key, value string
	owned            bool // map keys belong to one port; set keys may be shared
}

type elemID struct{ name, key string }

func newFrag() *frag {
	return &frag{chains: map[string][]string{}, affinity: map[string]int{}}
}

type portEntry struct {
	name model.ServicePortName
	fp   uint64
	fr   *frag
}

// tracker remembers, for each object an update touched, whether it
// existed before and with what content, so the diff visits only those.
type tracker struct {
	chains   map[string]prevChain
	affinity map[string]bool // existed before
	elems    map[elemID]prevElem
}

type prevChain struct {
	existed bool
	rules   []string
}

type prevElem struct {
	existed bool
	value   string
}

func newTracker() *tracker {
	return &tracker{chains: map[string]prevChain{}, affinity: map[string]bool{}, elems: map[elemID]prevElem{}}
}

func (t *tracker) chain(rs *ruleset, name string) {
	if t == nil {
		return
	}
	if _, ok := t.chains[name]; !ok {
		r, ok := rs.chains[name]
		t.chains[name] = prevChain{ok, r}
	}
}

func (t *tracker) aff(rs *ruleset, name string) {
	if t == nil {
		return
	}
	if _, ok := t.affinity[name]; !ok {
		_, ok := rs.affinity[name]
		t.affinity[name] = ok
	}
}

func (t *tracker) elem(rs *ruleset, id elemID) {
	if t == nil {
		return
	}
	if _, ok := t.elems[id]; !ok {
		v, ok := rs.elems[id.name][id.key]
		t.elems[id] = prevElem{ok, v}
	}
}

// add adds a port's fragment to rs. A map key another port already owns
// is logged and skipped; the rest of the port is still programmed, and
// the port gets the key when its owner lets go of it.
func (rs *ruleset) add(pe *portEntry, log *slog.Logger, tr *tracker) {
	fr, name := pe.fr, pe.name
	for c, rules := range fr.chains {
		tr.chain(rs, c)
		rs.chains[c] = rules
		rs.chainRefs[c]++
	}
	for a, t := range fr.affinity {
		tr.aff(rs, a)
		rs.affinity[a] = t
		rs.affRefs[a]++
	}
	for _, e := range fr.elems {
		id := elemID{e.name, e.key}
		if e.owned {
			if prev, ok := rs.owners[id]; ok && *prev != name {
				// The port that sorts first owns the key, as in a build
				// from scratch, so the result depends on the State only.
				loser, winner := name, *prev
				if name.String() < prev.String() {
					loser, winner = *prev, name
					rs.waiting[id] = append(rs.waiting[id], rs.ports[*prev])
				} else {
					rs.waiting[id] = append(rs.waiting[id], pe)
				}
				log.Error("nftables: address conflict, skipping", "servicePort", loser.String(),
					"conflictsWith", winner.String(), "map", e.name, "key", e.key)
				if winner != name {
					continue
				}
			}
			rs.owners[id] = &pe.name
		} else {
			rs.elemRefs[id]++
		}
		tr.elem(rs, id)
		rs.elems[e.name][e.key] = e.value
	}
}

// handOver gives a freed map key to the first waiting port still in rs.
// The waiting port whose name sorts first wins, as in a build from scratch.
func (rs *ruleset) handOver(id elemID, tr *tracker) bool {
	var best *portEntry
	var value string
	var keep []*portEntry
	for _, pe := range rs.waiting[id] {
		if rs.ports[pe.name] != pe {
			continue // gone or changed since
		}
		keep = append(keep, pe)
		if best != nil && best.name.String() <= pe.name.String() {
			continue
		}
		for _, e := range pe.fr.elems {
			if e.owned && e.name == id.name && e.key == id.key {
				best, value = pe, e.value
				break
			}
		}
	}
	if best == nil {
		delete(rs.waiting, id)
		return false
	}
	rs.waiting[id] = slices.DeleteFunc(keep, func(pe *portEntry) bool { return pe == best })
	if len(rs.waiting[id]) == 0 {
		delete(rs.waiting, id)
	}
	tr.elem(rs, id)
	rs.owners[id] = &best.name
	rs.elems[id.name][id.key] = value
	return true
}

// remove takes a port's fragment out of rs; shared chains, sets and set
// elements go when their last user goes.
func (rs *ruleset) remove(pe *portEntry, tr *tracker) {
	fr, name := pe.fr, pe.name
	for c := range fr.chains {
		if rs.chainRefs[c]--; rs.chainRefs[c] <= 0 {
			tr.chain(rs, c)
			delete(rs.chains, c)
			delete(rs.chainRefs, c)
		}
	}
	for a := range fr.affinity {
		if rs.affRefs[a]--; rs.affRefs[a] <= 0 {
			tr.aff(rs, a)
			delete(rs.affinity, a)
			delete(rs.affRefs, a)
		}
	}
	for _, e := range fr.elems {
		id := elemID{e.name, e.key}
		if e.owned {
			if o := rs.owners[id]; o == nil || *o != name {
				continue // skipped as a conflict when added
			}
			delete(rs.owners, id)
			if rs.handOver(id, tr) {
				continue
			}
		} else if rs.elemRefs[id]--; rs.elemRefs[id] > 0 {
			continue
		} else {
			delete(rs.elemRefs, id)
		}
		tr.elem(rs, id)
		delete(rs.elems[e.name], e.key)
	}
}

// fingerprint appends to buf everything about sp that the rules depend on.
func fingerprint(buf []byte, sp *model.ServicePort) []byte {
	str := func(s string) {
		buf = binary.AppendUvarint(buf, uint64(len(s)))
		buf = append(buf, s...)
	}
	num := func(n int) { buf = binary.AppendVarint(buf, int64(n)) }
	addr := func(a netip.Addr) {
		b := a.As16()
		if a.Is4() {
			buf = append(buf, 4)
		} else {
			buf = append(buf, 6)
		}
		buf = append(buf, b[:]...)
	}
	addrs := func(as []netip.Addr) {
		num(len(as))
		for _, a := range as {
			addr(a)
		}
	}
	eps := func(es []model.Endpoint) {
		if es == nil {
			num(-1)
			return
		}
		num(len(es))
		for _, e := range es {
			addr(e.IP)
			num(int(e.Port))
			var flags byte
			for i, f := range []bool{e.Ready, e.Serving, e.Terminating, e.Local} {
				if f {
					flags |= 1 << i
				}
			}
			buf = append(buf, flags)
		}
	}
	str(sp.Name.Namespace)
	str(sp.Name.Name)
	str(sp.Name.Port)
	str(string(sp.Name.Protocol))
	str(string(sp.Type))
	str(string(sp.Protocol))
	num(int(sp.Port))
	num(int(sp.NodePort))
	num(sp.AffinityTimeoutSeconds)
	str(string(sp.InternalTrafficPolicy))
	str(string(sp.ExternalTrafficPolicy))
	addrs(sp.ClusterIPs)
	addrs(sp.ExternalIPs)
	addrs(sp.LoadBalancerIPs)
	num(len(sp.LoadBalancerSourceRanges))
	for _, p := range sp.LoadBalancerSourceRanges {
		addr(p.Addr())
		num(p.Bits())
	}
	eps(sp.Endpoints)
	eps(sp.ClusterEndpoints)
	eps(sp.LocalEndpoints)
	return buf
}

// portWriter computes one family's fragment for one ServicePort.
type portWriter struct {
	b  *builder
	f  *family
	fr *frag
}

// element adds key→value to a map (owned: one port per key) or set.
func (w *portWriter) element(name, key, value string, owned bool) {
	w.fr.elems = append(w.fr.elems, fragElem{name: name, key: key, value: value, owned: owned})
}

func protoName(p model.Protocol) string {
	switch p {
	case model.TCP:
		return "tcp"
	case model.UDP:
		return "udp"
	case model.SCTP:
		return "sctp"
	}
	return ""
}

// portID names a ServicePort inside chain and set names.
func portID(n model.ServicePortName) string {
	port := n.Port
	if port == "" {
		port = "-"
	}
	return n.Namespace + "/" + n.Name + "/" + port + "/" + protoName(n.Protocol)
}

// eps returns the endpoints of in that w's family can program. It returns
// in itself when that is all of them (the common case), so callers must
// not modify the result.
func (w *portWriter) eps(in []model.Endpoint) []model.Endpoint {
	n := 0
	for _, e := range in {
		if w.f.has(e.IP) && e.Port != 0 {
			n++
		}
	}
	if n == len(in) {
		return in
	}
	if n == 0 {
		return nil
	}
	out := make([]model.Endpoint, 0, n)
	for _, e := range in {
		if w.f.has(e.IP) && e.Port != 0 {
			out = append(out, e)
		}
	}
	return out
}

func (w *portWriter) addrs(in []netip.Addr) []string {
	var out []string
	for _, a := range in {
		if w.f.has(a) {
			out = append(out, a.Unmap().String())
		}
	}
	return out
}

func (w *portWriter) endpointString(e model.Endpoint) string {
	if w.f.is6 {
		return "[" + e.IP.String() + "]:" + strconv.Itoa(int(e.Port))
	}
	return e.IP.Unmap().String() + ":" + strconv.Itoa(int(e.Port))
}

func endpointName(e model.Endpoint) string {
	return strings.ReplaceAll(e.IP.Unmap().String(), ":", "_") + "/" + strconv.Itoa(int(e.Port))
}

// pick returns the statement (rule tail) that sends a packet to one of eps
// chosen uniformly at random; with affinity it adds a sticky chain, one
// chain and one timeout set per endpoint, and returns a goto.
func (w *portWriter) pick(sp *model.ServicePort, id, label string, eps []model.Endpoint) string {
	proto := protoName(sp.Protocol)
	if sp.AffinityTimeoutSeconds > 0 {
		sticky := "sticky-" + label + "-" + id
		var rules, vmap []string
		for i, e := range eps {
			ep := "ep-" + id + "/" + endpointName(e)
			set := "aff-" + id + "/" + endpointName(e) + "/" + strconv.Itoa(sp.AffinityTimeoutSeconds)
			w.fr.affinity[set] = sp.AffinityTimeoutSeconds
			w.fr.chains[ep] = []string{
				"update @" + set + " { " + w.f.ip + " saddr }",
				"meta l4proto " + proto + " dnat " + w.f.ip + " to " + w.endpointString(e),
			}
			rules = append(rules, w.f.ip+" saddr @"+set+" goto "+ep)
			vmap = append(vmap, strconv.Itoa(i)+" : goto "+ep)
		}
		rules = append(rules, "numgen random mod "+strconv.Itoa(len(eps))+" vmap { "+strings.Join(vmap, " , ")+" }")
		w.fr.chains[sticky] = rules
		return "goto " + sticky
	}
	if len(eps) == 1 {
		return "meta l4proto " + proto + " dnat " + w.f.ip + " to " + w.endpointString(eps[0])
	}
	items := make([]string, len(eps))
	for i, e := range eps {
		items[i] = strconv.Itoa(i) + " : " + e.IP.Unmap().String() + " . " + strconv.Itoa(int(e.Port))
	}
	return "meta l4proto " + proto + " dnat " + w.f.ip + " to numgen random mod " + strconv.Itoa(len(eps)) +
		" map { " + strings.Join(items, ", ") + " }"
}

// dnatIP returns the statement that DNATs to one of n endpoints stored in
// the pol ("cluster" or "local") endpoint map under the packet's
// destination address, protocol and port.
//
// The maps are per protocol and the key names the protocol's own port
// field ("tcp dport"): nft 1.0.6 cannot read back a rule that combines a
// protocol match with "th dport" in a map key, so the generic form would
// break every later transaction.
func (w *portWriter) dnatIP(pol, proto string, n int) string {
	ip := w.f.ip
	return "dnat " + ip + " to " + ip + " daddr . " + proto + " dport . numgen random mod " +
		strconv.Itoa(n) + " map @" + endpointMap(pol, "endpoints", proto)
}

// dnatNP is dnatIP for NodePorts: the map is keyed by port alone.
func (w *portWriter) dnatNP(pol, proto string, n int) string {
	return "dnat " + w.f.ip + " to " + proto + " dport . numgen random mod " +
		strconv.Itoa(n) + " map @" + endpointMap(pol, "nodeport-endpoints", proto)
}

// nodeInRanges reports whether one of this node's IPs of w's family is in
// one of ranges.
func (w *portWriter) nodeInRanges(ranges []netip.Prefix) bool {
	for _, n := range w.b.opts.NodeIPs {
		if !w.f.has(n) {
			continue
		}
		for _, r := range ranges {
			if r.Contains(n.Unmap()) {
				return true
			}
		}
	}
	return false
}

// endpointMap names the endpoint map of a policy, kind and protocol.
func endpointMap(pol, kind, proto string) string { return pol + "-" + kind + "-" + proto }

// endpoints stores eps under key . slot in an endpoint map.
func (w *portWriter) endpoints(name, key string, eps []model.Endpoint) {
	for i, e := range eps {
		w.element(name, key+" . "+strconv.Itoa(i), e.IP.Unmap().String()+" . "+strconv.Itoa(int(e.Port)), true)
	}
}

// port adds everything of one ServicePort for w's family.
func (w *portWriter) port(sp *model.ServicePort) {
	f := w.f
	proto := protoName(sp.Protocol)
	if proto == "" || sp.Port == 0 {
		w.b.log.Error("nftables: skipping invalid service port", "servicePort", sp.Name.String(),
			"protocol", string(sp.Protocol), "port", sp.Port)
		return
	}
	id := portID(sp.Name)
	port := strconv.Itoa(int(sp.Port))
	vips := w.addrs(sp.ClusterIPs)
	extIPs := w.addrs(sp.ExternalIPs)
	lbIPs := w.addrs(sp.LoadBalancerIPs)
	nodePort := sp.NodePort != 0 && f.npMatch != ""
	if len(sp.ClusterIPs) > 0 && len(vips) == 0 {
		// Single-stack Service of the other family: its NodePort is not
		// opened in this family either.
		return
	}
	if len(vips) == 0 && len(extIPs) == 0 && len(lbIPs) == 0 && !nodePort {
		return
	}

	hasEndpoints := false
	for _, e := range w.eps(sp.Endpoints) {
		if e.Ready || (e.Serving && e.Terminating) {
			hasEndpoints = true
		}
	}
	for _, e := range w.eps(sp.ReachableEndpoints()) {
		if e.Ready || e.Serving {
			hasEndpoints = true
		}
	}
	noEndpoints := "goto " + chainReject
	if hasEndpoints {
		noEndpoints = "drop"
	}
	mark := "meta mark set meta mark | " + f.mark

	for _, e := range w.eps(sp.ReachableEndpoints()) {
		a := e.IP.Unmap().String()
		w.element(setHairpin, a+" . "+a, "", false)
	}

	sticky := sp.AffinityTimeoutSeconds > 0
	npPort := strconv.Itoa(int(sp.NodePort))
	npKey := proto + " . " + npPort

	// Internal traffic: ClusterIPs.
	if len(vips) > 0 {
		internal := w.eps(sp.InternalEndpoints())
		pol := "cluster"
		if sp.InternalPolicyLocal() {
			pol = "local"
		}
		// Masquerade what is not pod traffic. Without a cluster CIDR of
		// this family pod traffic cannot be told apart and, as in
		// kube-proxy, nothing is masqueraded (pods keep their source IP),
		// unless masqueradeAll.
		var masq []string
		switch {
		case w.b.opts.MasqueradeAll:
			masq = []string{mark}
		case f.notFromPod != "":
			masq = []string{f.notFromPod + " " + mark}
		}
		var chain string
		switch {
		case len(internal) == 0:
		case sticky:
			chain = "svc-" + id
			w.fr.chains[chain] = append(masq, w.pick(sp, id, pol, internal))
		default:
			chain = fmt.Sprintf("int-%s-%s-%d", pol, proto, len(internal))
			w.fr.chains[chain] = append(masq, w.dnatIP(pol, proto, len(internal)))
			for _, vip := range vips {
				w.endpoints(endpointMap(pol, "endpoints", proto), vip+" . "+port, internal)
			}
		}
		for _, vip := range vips {
			w.element(setClusterIPs, vip, "", false)
			key := vip + " . " + proto + " . " + port
			if chain != "" {
				w.element(mapServiceIPs, key, "goto "+chain, true)
			} else {
				w.element(mapNoEndpointIPs, key, noEndpoints, true)
			}
		}
	}

	// External traffic: externalIPs, load-balancer IPs, NodePorts.
	ext := append(append([]string(nil), extIPs...), lbIPs...)
	if len(ext) == 0 && !nodePort {
		return
	}
	external := w.eps(sp.ExternalEndpoints())
	if hasEndpoints {
		// ipChain serves external IPs, npChain NodePorts; they differ only
		// in the key of the endpoint map (address or port).
		var ipChain, npChain string
		var short []model.Endpoint
		shortPol := "cluster"
		if sp.ExternalPolicyLocal() {
			short = w.eps(sp.ClusterEndpoints)
			if sp.ClusterEndpoints == nil {
				short, shortPol = w.eps(sp.LocalEndpoints), "local"
			}
		}
		switch {
		case sticky:
			var rules []string
			if !sp.ExternalPolicyLocal() {
				if len(external) > 0 {
					rules = append(rules, mark, w.pick(sp, id, "cluster", external))
				}
			} else {
				if len(short) > 0 {
					to := w.pick(sp, id, shortPol, short)
					if f.fromPod != "" {
						rules = append(rules, f.fromPod+" "+to)
					}
					rules = append(rules, "fib saddr type local "+mark+" "+to)
				}
				if len(external) > 0 {
					rules = append(rules, w.pick(sp, id, "local", external))
				}
			}
			if len(rules) > 0 {
				ipChain, npChain = "ext-"+id, "ext-"+id
				w.fr.chains[ipChain] = rules
			}
		case !sp.ExternalPolicyLocal():
			if len(external) > 0 {
				n := len(external)
				ipChain, npChain = fmt.Sprintf("ext-cluster-%s-%d", proto, n), fmt.Sprintf("np-cluster-%s-%d", proto, n)
				w.fr.chains[ipChain] = []string{mark, w.dnatIP("cluster", proto, n)}
				w.fr.chains[npChain] = []string{mark, w.dnatNP("cluster", proto, n)}
				for _, a := range ext {
					w.endpoints(endpointMap("cluster", "endpoints", proto), a+" . "+port, external)
				}
				if nodePort {
					w.endpoints(endpointMap("cluster", "nodeport-endpoints", proto), npPort, external)
				}
			}
		default:
			c, l := len(short), len(external)
			if c+l > 0 {
				ipChain, npChain = fmt.Sprintf("ext-local-%s-%d-%d", proto, c, l), fmt.Sprintf("np-local-%s-%d-%d", proto, c, l)
				var ipRules, npRules []string
				if c > 0 {
					if f.fromPod != "" {
						// Pod traffic to external destinations is subject to neither policy.
						ipRules = append(ipRules, f.fromPod+" "+w.dnatIP("cluster", proto, c))
						npRules = append(npRules, f.fromPod+" "+w.dnatNP("cluster", proto, c))
					}
					// Node traffic: its source is a local address; masquerade it.
					ipRules = append(ipRules, "fib saddr type local "+mark+" "+w.dnatIP("cluster", proto, c))
					npRules = append(npRules, "fib saddr type local "+mark+" "+w.dnatNP("cluster", proto, c))
				}
				if l > 0 {
					ipRules = append(ipRules, w.dnatIP("local", proto, l))
					npRules = append(npRules, w.dnatNP("local", proto, l))
				}
				w.fr.chains[ipChain], w.fr.chains[npChain] = ipRules, npRules
				for _, a := range ext {
					w.endpoints(endpointMap("cluster", "endpoints", proto), a+" . "+port, short)
					w.endpoints(endpointMap("local", "endpoints", proto), a+" . "+port, external)
				}
				if nodePort {
					w.endpoints(endpointMap("cluster", "nodeport-endpoints", proto), npPort, short)
					w.endpoints(endpointMap("local", "nodeport-endpoints", proto), npPort, external)
				}
			}
		}
		if ipChain != "" {
			if len(ext) == 0 && !sticky {
				delete(w.fr.chains, ipChain)
			}
			if !nodePort && !sticky {
				delete(w.fr.chains, npChain)
			}
			for _, a := range ext {
				w.element(mapServiceIPs, a+" . "+proto+" . "+port, "goto "+ipChain, true)
			}
			if nodePort {
				w.element(mapServiceNodePorts, npKey, "goto "+npChain, true)
			}
		}
	}
	if len(external) == 0 {
		for _, a := range ext {
			w.element(mapNoEndpointIPs, a+" . "+proto+" . "+port, noEndpoints, true)
		}
		if nodePort {
			w.element(mapNoEndpointPorts, npKey, noEndpoints, true)
		}
	}

	// loadBalancerSourceRanges: checked before DNAT, on LB IPs only.
	var ranges []string
	for _, p := range sp.LoadBalancerSourceRanges {
		if f.has(p.Addr()) {
			ranges = append(ranges, prefixString(p))
		}
	}
	if len(lbIPs) > 0 && len(ranges) > 0 {
		// As kube-proxy: when this node is inside the allowed ranges, so
		// are packets from the LB IPs themselves (a VIP-like load
		// balancer whose IP is local: the node's requests to it leave
		// with the LB IP as source).
		if w.nodeInRanges(sp.LoadBalancerSourceRanges) {
			for _, a := range lbIPs {
				if !slices.ContainsFunc(sp.LoadBalancerSourceRanges, func(r netip.Prefix) bool { return r.Contains(netip.MustParseAddr(a)) }) {
					ranges = append(ranges, a)
				}
			}
		}
		sort.Strings(ranges)
		fw := "fw-" + id
		w.fr.chains[fw] = []string{f.ip + " saddr != " + anonSet(ranges) + " drop"}
		for _, a := range lbIPs {
			w.element(mapFirewallIPs, a+" . "+proto+" . "+port, "goto "+fw, true)
		}
	}
}
