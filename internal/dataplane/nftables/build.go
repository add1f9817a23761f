package nftables

// The builder: fragments cached per ServicePort (portcache: reused while
// the port is unchanged), built in parallel on a cold start, their shared
// chains interned, and update, which brings a family's ruleset to a new
// State touching only the ports that changed.

import (
	"log/slog"
	"runtime"
	"slices"
	"sync"

	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/portcache"
	"github.com/vipproxy/vipproxy/internal/model"
)

// builder turns a State into one ruleset per family.
type builder struct {
	opts *dataplane.Options
	log  *slog.Logger
	fams []*family
	// cache holds each family's fragments by port name. A fragment
	// depends only on its port and the family (options do not change in
	// a Proxier's life), so the cache is never invalidated; a ruleset's
	// port is unchanged exactly when the cache hands back its fragment.
	cache map[knftables.Family]*portcache.Cache[model.ServicePortName, *frag]
	// shared holds each family's one copy of every shared chain (see
	// intern); a few dozen, never dropped.
	shared map[knftables.Family]map[string]*sharedChain
	// last is the last full build (only its sizes are read).
	last map[knftables.Family]*ruleset
	// scratch serves the fragments update builds, one at a time.
	scratch scratch
}

func newBuilder(o *dataplane.Options) *builder {
	b := &builder{opts: o, log: o.Log(), cache: map[knftables.Family]*portcache.Cache[model.ServicePortName, *frag]{},
		shared: map[knftables.Family]map[string]*sharedChain{}}
	for _, fam := range families {
		b.fams = append(b.fams, newFamily(fam, o))
		b.cache[fam] = &portcache.Cache[model.ServicePortName, *frag]{}
		b.shared[fam] = map[string]*sharedChain{}
	}
	return b
}

// build returns the desired ruleset of every family, built from scratch
// (fragments of unchanged ports come from the cache). Ports it cannot
// program (zero port, unknown protocol, address conflicts) are skipped
// with a log line; they never affect the other ports.
func (b *builder) build(st *model.State) map[knftables.Family]*ruleset {
	out := map[knftables.Family]*ruleset{}
	for _, f := range b.fams {
		rs := newRuleset()
		// Size the maps like last time: growing maps of 10^5 entries
		// was a large part of a full sync.
		if prev := b.last[f.fam]; prev != nil {
			rs.chains = make(map[string][]string, len(prev.chains))
			rs.ports = make(map[model.ServicePortName]*portEntry, len(prev.ports))
			rs.chainRefs = make(map[string]int, len(prev.chainRefs))
		}
		for name, rules := range staticChains(f.ip, f.npMatch, f.svcCIDRs, f.markVal) {
			rs.chains[name] = rules
		}
		for _, m := range staticMaps(f.ip) {
			rs.elems[m.name] = newElemTable(b.lastLen(f.fam, m.name))
		}
		for _, s := range staticSets(f.ip) {
			rs.elems[s.name] = newElemTable(b.lastLen(f.fam, s.name))
		}
		if st != nil {
			// Fragments first, so that on a first build the maps can be
			// sized from what they will hold.
			frags := b.fragments(f, st.Ports)
			if b.last[f.fam] == nil {
				sizes := map[string]int{}
				for _, fr := range frags {
					if fr != nil {
						for i := range fr.elems {
							sizes[fr.elems[i].name()]++
						}
					}
				}
				for name, n := range sizes {
					rs.elems[name] = newElemTable(n)
				}
				served := 0
				for _, fr := range frags {
					if fr != nil {
						served++
					}
				}
				rs.ports = make(map[model.ServicePortName]*portEntry, served)
			}
			rs.served = newBitset(len(st.Ports))
			pes := make([]*portEntry, 0, len(st.Ports))
			for i, sp := range st.Ports {
				if frags[i] == nil {
					continue // nil, or not served by f
				}
				rs.served.set(i)
				pe := &portEntry{name: sp.Name, fr: frags[i]}
				rs.ports[sp.Name] = pe
				pes = append(pes, pe)
			}
			if len(pes) >= parallelFrom {
				rs.addAll(pes, b.log)
			} else {
				for _, pe := range pes {
					rs.add(pe, b.log, nil)
				}
			}
		}
		b.cache[f.fam].Sweep() // drop the ports st no longer has
		out[f.fam] = rs
	}
	b.last = out
	return out
}

// lastLen is the size of a map or set in the last build.
func (b *builder) lastLen(f knftables.Family, name string) int {
	if prev := b.last[f]; prev != nil {
		return prev.elems[name].Len()
	}
	return 0
}

// parallelFrom is the number of ports from which fragments is worth
// spreading over the CPUs.
var parallelFrom = 2000

// fragments returns the fragment of each port (nil for a nil port and
// one f does not serve) for family f: the cached one when the port is
// unchanged, else a new one,
// which it caches. Many new fragments are built over GOMAXPROCS
// goroutines: fragments are independent, and newFragment only reads the
// builder.
func (b *builder) fragments(f *family, ports []*model.ServicePort) []*frag {
	c := b.cache[f.fam]
	out := make([]*frag, len(ports))
	var missing []int
	for i, sp := range ports {
		if sp == nil || !f.serves(sp) {
			continue
		}
		if fr, ok := c.Lookup(sp.Name, sp); ok {
			out[i] = fr
		} else {
			missing = append(missing, i)
		}
	}
	one := func(lo, hi int) {
		var sc scratch // one per goroutine
		for _, i := range missing[lo:hi] {
			out[i] = b.newFragment(f, ports[i], &sc)
		}
	}
	if workers := min(runtime.GOMAXPROCS(0), len(missing)/parallelFrom); workers < 2 {
		one(0, len(missing))
	} else {
		var wg sync.WaitGroup
		chunk := (len(missing) + workers - 1) / workers
		for lo := 0; lo < len(missing); lo += chunk {
			wg.Add(1)
			go func(lo, hi int) {
				defer wg.Done()
				one(lo, hi)
			}(lo, min(lo+chunk, len(missing)))
		}
		wg.Wait()
	}
	for _, i := range missing {
		b.intern(f, out[i])
		c.Put(ports[i].Name, ports[i], out[i])
	}
	return out
}

// sharedChain is the one copy of a shared chain's name and rules.
type sharedChain struct {
	name  string
	rules []string
}

// intern makes fr's shared chains use the builder's one copy instead of
// the port's own: at 10,000 ports that is one copy of int-cluster-tcp-10
// instead of 10,000. (The verdicts jumping to them are a few bytes of
// each fragment's text.) Not safe for concurrent use: fragments are
// interned after they are built.
func (b *builder) intern(f *family, fr *frag) {
	tab := b.shared[f.fam]
	for i := range fr.chains {
		c := &fr.chains[i]
		if !c.shared {
			continue
		}
		s := tab[c.name]
		if s == nil {
			s = &sharedChain{name: c.name, rules: c.rules}
			tab[c.name] = s
		} else if !slices.Equal(s.rules, c.rules) {
			// A bug in the rule writer: keep the port's own rules, which
			// the ruleset's last writer wins with, and say so.
			b.log.Error("nftables: shared chain built with different rules", "chain", c.name)
			continue
		}
		c.name, c.rules = s.name, s.rules
	}
}

// scratch is the buffers a portWriter writes a fragment's elements into
// before they are copied out at their size. Reused from one fragment to
// the next, they leave no garbage behind: a buffer per fragment was
// about as large as the text kept, and in the same size classes, so
// after a cold start the kept texts sat in half-empty spans (at 10,000
// Services 68.0 MB of spans held 57.9 MB of live data; with the scratch
// and the smaller element tables, 56.9 MB held 49.0 MB).
type scratch struct {
	arena []byte
	spans []span
}

// newFragment builds sp's fragment for family f in sc's buffers. It only
// reads b, so it may run concurrently with itself (with a scratch each).
func (b *builder) newFragment(f *family, sp *model.ServicePort, sc *scratch) *frag {
	w := &portWriter{b: b, f: f, fr: &frag{}, spans: sc.spans[:0], arena: sc.arena[:0]}
	w.port(sp)
	w.fr.text, w.fr.elems = w.elems()
	sc.arena, sc.spans = w.arena, w.spans
	return w.fr
}

// update brings rs (the last applied ruleset of family f, built from the
// ports prev) to st in place, touching only ports that changed, and
// records in tr what each touched object was before. A port that is the
// same pointer at the same index as in prev is unchanged (States are
// read-only) and costs no lookup; any other port is unchanged when the
// cache hands back the fragment rs has for it. Ports f does not serve
// are skipped (see family.serves). Afterwards rs is built from st: prev
// of the next update must be st's Ports.
func (b *builder) update(f *family, rs *ruleset, st *model.State, prev []*model.ServicePort, tr *tracker) {
	type change struct {
		sp *model.ServicePort
		fr *frag
	}
	c := b.cache[f.fam]
	var changes []change
	kept := 0 // ports of rs still in st
	var served bitset
	if st != nil {
		// The ports that did not change keep their bits; the loop does
		// nothing more for them than compare two pointers.
		served = newBitset(len(st.Ports))
		copy(served, rs.served)
		served.truncate(len(st.Ports))
		kept = served.count()
		for i, sp := range st.Ports {
			if i < len(prev) && prev[i] == sp {
				continue
			}
			if served.has(i) {
				served.clear(i)
				kept--
			}
			if sp == nil || !f.serves(sp) {
				continue // and if it was served, it is gone below
			}
			served.set(i)
			fr := c.Get(sp.Name, sp, func(sp *model.ServicePort) *frag {
				fr := b.newFragment(f, sp, &b.scratch)
				b.intern(f, fr)
				return fr
			})
			old, ok := rs.ports[sp.Name]
			if ok {
				kept++
				if old.fr == fr {
					continue
				}
			}
			changes = append(changes, change{sp, fr})
		}
	}
	// Removals first, so that an address moving between ports is free
	// when its new owner is added. (Names are unique in a State, so when
	// every port of rs was found, none is gone.)
	var gone []model.ServicePortName
	if kept < len(rs.ports) {
		seen := map[model.ServicePortName]bool{}
		if st != nil {
			for i, sp := range st.Ports {
				if served.has(i) {
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
		rs.remove(rs.ports[name], tr)
		delete(rs.ports, name)
		c.Delete(name)
	}
	for _, ch := range changes {
		if old, ok := rs.ports[ch.sp.Name]; ok {
			rs.remove(old, tr)
		}
	}
	for _, ch := range changes {
		pe := &portEntry{name: ch.sp.Name, fr: ch.fr}
		rs.ports[ch.sp.Name] = pe
		rs.add(pe, b.log, tr)
	}
	rs.served = served
}
