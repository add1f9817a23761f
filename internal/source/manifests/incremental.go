package manifests

import (
	"context"
	"slices"
	"sort"
	"strings"

	"github.com/vipproxy/vipproxy/internal/model"
)

// incState lets a rescan whose changes only replace objects in place (an
// edited port, endpoint or address; the same objects at the same places
// of the same files) patch the last snapshot instead of merging every
// file again: at 10,000 Services the full merge (duplicate detection,
// assignment lookups, sorting) costs several milliseconds per change.
//
// It is used only when the last snapshot had no Problems beyond the
// files' own (no duplicates, no assignment or directory trouble): then
// every object is its key's winner, at a position its name fixes, and
// TestIncrementalMatchesFull checks the result equals a full merge.
// Anything else takes the full path, which resets this state.
type incState struct {
	// What the current rescan found (reset by incremental).
	changed    []changedFile
	structural bool // files added, removed or unreadable; objects added, removed or moved

	built *model.Snapshot // the last snapshot returned
	ok    bool            // built qualifies for patching
	count int             // snapshots patched (tests look)
}

// changedFile is a file whose new content replaces objects in place.
type changedFile struct {
	name string
	st   *fileState
}

// incremental returns the last snapshot patched with this rescan's
// changes, or false when a full merge is needed. The Services and Slices
// lists are copied (the previous Snapshot may still be in use; its
// objects are shared, read-only), then the changed objects are replaced
// at their positions.
func (s *Source) incremental(ctx context.Context) (*model.Snapshot, bool) {
	in := &s.inc
	changed, structural := in.changed, in.structural
	in.changed, in.structural = in.changed[:0], false
	if structural || !in.ok || in.built == nil || s.noIncremental {
		return nil, false
	}
	prev := in.built
	if len(changed) == 0 {
		in.count++
		return prev, true // nothing changed: the same snapshot (Run drops it)
	}
	s.snaps++
	snap := &model.Snapshot{
		Services: slices.Clone(prev.Services),
		Slices:   slices.Clone(prev.Slices),
		Node:     prev.Node,
		Gen:      s.snaps,
	}
	// What changed, for the Builder (model.Patch); dropped when a slice
	// moved to another Service.
	patch := &model.Patch{Base: prev.Gen}
	var locs []located
	for _, c := range changed {
		for i := range c.st.good {
			locs = append(locs, located{c.name, &c.st.good[i]})
		}
	}
	s.preassign(ctx, locs)
	for _, l := range locs {
		switch {
		case l.e.svc != nil:
			svc, ps, ok := s.assign(ctx, l)
			if !ok || len(ps) > 0 {
				return nil, false // the full merge words (and logs) it
			}
			i, found := slices.BinarySearchFunc(snap.Services, svc.ServiceName, func(x *model.Service, n model.ServiceName) int {
				return compareNames(x.ServiceName, n)
			})
			if !found {
				return nil, false
			}
			snap.Services[i] = svc
			if patch != nil {
				patch.Services = append(patch.Services, i)
			}
		case l.e.slice != nil:
			sl := l.e.slice
			i, found := slices.BinarySearchFunc(snap.Slices, sl, func(x, y *model.EndpointSlice) int {
				if c := strings.Compare(x.Service.Namespace, y.Service.Namespace); c != 0 {
					return c
				}
				return strings.Compare(x.Name, y.Name)
			})
			if !found {
				return nil, false
			}
			if snap.Slices[i].Service != sl.Service {
				patch = nil
			} else if patch != nil {
				patch.Slices = append(patch.Slices, i)
			}
			snap.Slices[i] = sl
		case l.e.node != nil:
			snap.Node = l.e.node
		}
	}
	s.assigns.batch = nil
	names := make([]string, 0, len(s.files))
	for n := range s.files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		snap.Problems = append(snap.Problems, s.files[n].problems...)
	}
	if prev.Gen != 0 {
		snap.Patch = patch
	}
	in.built = snap
	in.count++
	return snap, true
}
