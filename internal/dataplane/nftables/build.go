package nftables

// The builder: fragments cached by the fingerprint of their ServicePort,
// built in parallel on a cold start, and update, which brings a family's
// ruleset to a new State touching only the ports that changed.

import (
	"encoding/binary"
	"hash/maphash"
	"log/slog"
	"net/netip"
	"runtime"
	"slices"
	"sync"

	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/model"
)

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
