package model

import (
	"slices"
)

// patch builds snap, a Patch of the Snapshot c built last, by rebuilding
// only the Services the Patch names (and those owning the slices it
// names) and splicing their ports into the last Build's sorted port list.
// It returns nil, having changed nothing the next full Build relies on,
// when the result could differ from a full Build's: a Patch that breaks
// its contract (an index out of range, a Service not where the sort order
// puts it) or two ports with one name. Per-Service work
// is then proportional to the change; what stays proportional to the
// Services is copying the port list's pointers once (the new State's
// Ports are that copy), and checking claims across Services when some
// port has an externalIP or load-balancer IP (Uses.Claims).
func (b *builder) patch(snap *Snapshot, c *Builder) *State {
	svcs := snap.Services
	// The Services to rebuild, by index, each once.
	var todo []int
	for _, i := range snap.Patch.Services {
		if i < 0 || i >= len(svcs) {
			return nil
		}
		todo = append(todo, i)
	}
	for _, j := range snap.Patch.Slices {
		if j < 0 || j >= len(snap.Slices) {
			return nil
		}
		n := snap.Slices[j].Service
		i, found := slices.BinarySearchFunc(svcs, n, func(s *Service, n ServiceName) int {
			return compareServiceName(s.ServiceName, n)
		})
		if found {
			todo = append(todo, i)
		} // else: a slice of no Service builds nothing
	}
	slices.Sort(todo)
	todo = slices.Compact(todo)

	b.problems = b.problems[:0]
	// keyed is shared with the last State's Ports (see remember): copied
	// before it changes.
	keyed := slices.Clone(c.keyed)
	problemOf := slices.Clone(c.problemOf)
	uses := c.uses
	for _, i := range todo {
		svc := svcs[i]
		if (i > 0 && compareServiceName(svcs[i-1].ServiceName, svc.ServiceName) >= 0) ||
			(i+1 < len(svcs) && compareServiceName(svc.ServiceName, svcs[i+1].ServiceName) >= 0) {
			return nil // not sorted or not unique around i
		}
		idx := b.slicesFor(svc.ServiceName)
		old := c.cache[svc.ServiceName]
		if c.lookup(svc, snap.Slices, idx) != nil {
			continue // equal to what was built
		}
		if old != nil {
			for _, sp := range old.ports {
				pos, found := slices.BinarySearchFunc(keyed, sp, comparePorts)
				if !found || keyed[pos] != sp {
					return nil
				}
				keyed = slices.Delete(keyed, pos, pos+1)
				uses.count(sp, -1)
			}
		}
		built := b.service(svc, idx)
		k0 := len(b.ports)
		for _, sp := range built {
			pos, found := slices.BinarySearchFunc(keyed, sp, comparePorts)
			if found {
				return nil // a key twice: let the full path report it
			}
			keyed = slices.Insert(keyed, pos, sp)
			b.ports = append(b.ports, sp)
			uses.count(sp, 1)
		}
		c.store(svc, slicesOf(snap.Slices, idx), b.ports[k0:], b.problems)
		pos, had := slices.BinarySearchFunc(problemOf, svc.ServiceName, compareServiceName)
		switch has := len(b.problems) > 0; {
		case has && !had:
			problemOf = slices.Insert(problemOf, pos, svc.ServiceName)
		case !has && had:
			problemOf = slices.Delete(problemOf, pos, pos+1)
		}
		b.problems = b.problems[:0]
	}
	clear(b.ports)
	b.ports = b.ports[:0]

	st := &State{NodeName: b.nodeName, Node: snap.Node, Uses: &uses}
	// The State's Ports are keyed itself: neither ever changes (a State
	// is read-only, the next patch copies keyed, resolveClusterIPClaims
	// copies st.Ports before it replaces a port).
	st.Ports = keyed[:len(keyed):len(keyed)]
	c.built, c.keyed, c.problemOf, c.uses = snap.Gen, keyed, problemOf, uses
	c.patched++
	// Problems as the full path orders them: the source's, each
	// Service's in name order, then the claims'.
	b.problems = append([]Problem(nil), snap.Problems...)
	for _, n := range problemOf {
		b.problems = append(b.problems, c.cache[n].problems...)
	}
	b.resolveClusterIPClaims(st, c)
	st.Problems = b.problems
	b.problems, b.snap = nil, nil
	return st
}
