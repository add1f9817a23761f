package nftables

// Fragments in a ruleset: what each ServicePort contributes, the
// reference counts of shared chains and elements, and the tracker that
// records what an update touched so the diff visits only that.

import (
	"log/slog"
	"slices"

	"github.com/vipproxy/vipproxy/internal/model"
)

// frag is everything one ServicePort contributes to one family's ruleset.
// Fragments are cached per port (see builder.cache), so an unchanged port
// costs a pointer or ServicePort.Equal comparison, not a rebuild.
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
