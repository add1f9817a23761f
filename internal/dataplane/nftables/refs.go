package nftables

// Fragments in a ruleset: what each ServicePort contributes, the
// reference counts of shared chains and elements, and the tracker that
// records what an update touched so the diff visits only that.

import (
	"log/slog"
	"runtime"
	"slices"
	"sync"

	"github.com/vipproxy/vipproxy/internal/model"
)

// frag is everything one ServicePort contributes to one family's ruleset.
// Fragments are cached per port (see builder.cache), so an unchanged port
// costs a pointer or ServicePort.Equal comparison, not a rebuild.
// It is kept for the port's life, 10,000s of them, so it is compact:
// slices rather than maps (a port has a few chains), shared chains
// interned (see builder.intern), and the elements' text in one string,
// each element's key and value right after the previous element's,
// with its map or set named by a one-byte index: 8 bytes per element
// besides its text, none of them a pointer for the collector to follow.
type frag struct {
	chains   []fragChain
	affinity []fragSet // ClientIP-affinity sets; nil for most ports
	text     string    // every element's key and value, back to back
	elems    []fragElem
}

// key is element i's key: its text from the end of element i-1's.
func (fr *frag) key(i int) string {
	k0 := uint32(0)
	if i > 0 {
		k0 = fr.elems[i-1].v1
	}
	e := &fr.elems[i]
	return fr.text[k0 : e.v1-uint32(e.vlen)]
}

// value is element i's value ("" for a set's).
func (fr *frag) value(i int) string {
	e := &fr.elems[i]
	return fr.text[e.v1-uint32(e.vlen) : e.v1]
}

// fragChain is a chain a port needs. A shared chain (int-cluster-tcp-3)
// serves every port with the same name; its rules depend only on the name
// and the family.
type fragChain struct {
	name   string
	rules  []string
	shared bool
}

// fragSet is a ClientIP-affinity set and its timeout in seconds.
type fragSet struct {
	name    string
	timeout int
}

// fragElem is an element of a static map or set: its value is the last
// vlen bytes of its fragment's text[:v1], its key the text before that
// back to the previous element's v1 (or 0); set indexes elemSets. A value
// is a verdict naming a chain (nft names have at most 255 bytes) or
// concatenated addresses and ports, so 16 bits hold its length.
type fragElem struct {
	v1   uint32
	vlen uint16
	set  uint8
}

// name is the element's map or set.
func (e *fragElem) name() string { return elemSets[e.set].name }

// owned reports whether the element is a map key, which belongs to one
// port; set keys may be shared.
func (e *fragElem) owned() bool { return elemSets[e.set].isMap }

// elemSets are the static maps and sets fragments put elements in (the
// same names in both families); elemSet indexes them by name.
var elemSets, elemSet = func() ([]elemSetInfo, map[string]uint8) {
	var list []elemSetInfo
	for _, m := range staticMaps("ip") {
		list = append(list, elemSetInfo{m.name, true})
	}
	for _, s := range staticSets("ip") {
		list = append(list, elemSetInfo{s.name, false})
	}
	idx := make(map[string]uint8, len(list))
	for i, e := range list {
		idx[e.name] = uint8(i)
	}
	return list, idx
}()

// elemSetInfo is a static map (isMap) or set.
type elemSetInfo struct {
	name  string
	isMap bool
}

type elemID struct{ name, key string }

type portEntry struct {
	name model.ServicePortName
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
		e, ok := rs.elems[id.name].Get(id.key)
		t.elems[id] = prevElem{ok, e.value()}
	}
}

// add adds a port's fragment to rs. A map key another port already owns
// is logged and skipped; the rest of the port is still programmed, and
// the port gets the key when its owner lets go of it.
func (rs *ruleset) add(pe *portEntry, log *slog.Logger, tr *tracker) {
	rs.addContainers(pe, tr)
	rs.addElems(pe, log, tr, nil, &rs.sum, rs.waiting)
}

// addContainers adds a port's chains and affinity sets to rs.
func (rs *ruleset) addContainers(pe *portEntry, tr *tracker) {
	for _, c := range pe.fr.chains {
		tr.chain(rs, c.name)
		rs.chains[c.name] = c.rules
		rs.chainRefs[c.name]++
	}
	for _, a := range pe.fr.affinity {
		tr.aff(rs, a.name)
		rs.affinity[a.name] = a.timeout
		rs.affRefs[a.name]++
	}
}

// addElems adds a port's elements to rs's maps and sets: those of every
// map and set, or with only, those of the ones only marks. It updates sum
// and waiting instead of rs's own, so that elements of different maps
// can be added concurrently (see addAll).
func (rs *ruleset) addElems(pe *portEntry, log *slog.Logger, tr *tracker, only *[256]bool, sum *digest, waiting map[elemID][]*portEntry) {
	fr, name := pe.fr, pe.name
	var m *elemTable // the map or set of the run of elements e is in
	set := -1
	for i := range fr.elems {
		e := &fr.elems[i]
		if only != nil && !only[e.set] {
			continue
		}
		key := fr.key(i)
		id := elemID{e.name(), key}
		if int(e.set) != set {
			m, set = rs.elems[id.name], int(e.set)
		}
		cur, _ := m.Get(key)
		if e.owned() {
			if prev := cur.owner(); prev != nil && prev.name != name {
				// The port that sorts first owns the key, as in a build
				// from scratch, so the result depends on the State only.
				loser, winner := name, prev.name
				if name.Compare(prev.name) < 0 {
					loser, winner = prev.name, name
					waiting[id] = append(waiting[id], rs.ports[prev.name])
				} else {
					waiting[id] = append(waiting[id], pe)
				}
				log.Error("nftables: address conflict, skipping", "servicePort", loser.String(),
					"conflictsWith", winner.String(), "map", id.name, "key", wireText{id.name, key})
				if winner != name {
					continue
				}
			}
			if cur.owner() != nil {
				sum.add(id.name, key, cur.value())
			}
			sum.add(id.name, key, fr.value(i))
			cur = elem{src: pe, i: int32(i)}
		} else {
			if cur.n == 0 {
				sum.add(id.name, key, "")
				cur = elem{src: pe, i: int32(i)}
			}
			cur.n++
		}
		tr.elem(rs, id)
		m.Set(cur)
	}
}

// addAll adds the fragments of pes, every one new to rs (a full build),
// in order: the containers first, then the elements over up to GOMAXPROCS
// goroutines, each adding those of its own maps and sets (an element
// touches only its own table, and the digest is a XOR). Each goroutine
// takes the ports in order, so every table, waiting list and digest is
// what adding them one by one gives. At 50,000 Services adding 731,000
// elements one by one was 0.24 s of a restart's CPU.
func (rs *ruleset) addAll(pes []*portEntry, log *slog.Logger) {
	for _, pe := range pes {
		rs.addContainers(pe, nil)
	}
	var load [256]int
	for _, pe := range pes {
		for i := range pe.fr.elems {
			load[pe.fr.elems[i].set]++
		}
	}
	sets := make([]int, 0, len(elemSets))
	for i := range elemSets {
		if load[i] > 0 {
			sets = append(sets, i)
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(sets))
	if workers < 2 {
		for _, pe := range pes {
			rs.addElems(pe, log, nil, nil, &rs.sum, rs.waiting)
		}
		return
	}
	// The largest tables first, each to the least loaded goroutine.
	slices.SortFunc(sets, func(a, b int) int { return load[b] - load[a] })
	type part struct {
		only    [256]bool
		load    int
		sum     digest
		waiting map[elemID][]*portEntry
	}
	parts := make([]part, workers)
	for _, set := range sets {
		least := &parts[0]
		for i := range parts {
			if parts[i].load < least.load {
				least = &parts[i]
			}
		}
		least.only[set] = true
		least.load += load[set]
	}
	var wg sync.WaitGroup
	for i := range parts {
		p := &parts[i]
		p.waiting = map[elemID][]*portEntry{}
		wg.Go(func() {
			for _, pe := range pes {
				rs.addElems(pe, log, nil, &p.only, &p.sum, p.waiting)
			}
		})
	}
	wg.Wait()
	for i := range parts {
		for j := range rs.sum {
			rs.sum[j] ^= parts[i].sum[j]
		}
		for id, l := range parts[i].waiting {
			rs.waiting[id] = l // each key is one table's, so one part's
		}
	}
}

// handOver gives a freed map key to the first waiting port still in rs.
// The waiting port whose name sorts first wins, as in a build from scratch.
func (rs *ruleset) handOver(id elemID, tr *tracker) bool {
	var best *portEntry
	var index int32
	var keep []*portEntry
	for _, pe := range rs.waiting[id] {
		if rs.ports[pe.name] != pe {
			continue // gone or changed since
		}
		keep = append(keep, pe)
		if best != nil && best.name.String() <= pe.name.String() {
			continue
		}
		for k, e := range pe.fr.elems {
			if e.owned() && e.name() == id.name && pe.fr.key(k) == id.key {
				best, index = pe, int32(k)
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
	if cur, _ := rs.elems[id.name].Get(id.key); cur.owner() != nil {
		rs.sum.add(id.name, id.key, cur.value())
	}
	rs.sum.add(id.name, id.key, best.fr.value(int(index)))
	rs.elems[id.name].Set(elem{src: best, i: index})
	return true
}

// remove takes a port's fragment out of rs; shared chains, sets and set
// elements go when their last user goes.
func (rs *ruleset) remove(pe *portEntry, tr *tracker) {
	fr, name := pe.fr, pe.name
	for _, c := range fr.chains {
		if rs.chainRefs[c.name]--; rs.chainRefs[c.name] <= 0 {
			tr.chain(rs, c.name)
			delete(rs.chains, c.name)
			delete(rs.chainRefs, c.name)
		}
	}
	for _, a := range fr.affinity {
		if rs.affRefs[a.name]--; rs.affRefs[a.name] <= 0 {
			tr.aff(rs, a.name)
			delete(rs.affinity, a.name)
			delete(rs.affRefs, a.name)
		}
	}
	for i := range fr.elems {
		e := &fr.elems[i]
		key := fr.key(i)
		id := elemID{e.name(), key}
		cur, ok := rs.elems[id.name].Get(key)
		if !ok {
			continue
		}
		if e.owned() {
			if o := cur.owner(); o == nil || o.name != name {
				continue // skipped as a conflict when added
			}
			if rs.handOver(id, tr) {
				continue
			}
		} else if cur.n--; cur.n > 0 {
			rs.elems[id.name].Set(cur)
			continue
		}
		tr.elem(rs, id)
		rs.sum.add(id.name, key, cur.value())
		rs.elems[id.name].Delete(key)
	}
}
