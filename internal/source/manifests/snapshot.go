package manifests

// The snapshot a Source sends: the objects of every file merged in name
// order, and in standalone mode their ClusterIPs and NodePorts assigned.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strings"

	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/source"
)

// snapshot merges the files, assigns addresses and assembles a Snapshot.
func (s *Source) snapshot(ctx context.Context, problems []model.Problem) *model.Snapshot {
	dirTrouble := len(problems) > 0
	names := make([]string, 0, len(s.files))
	for n := range s.files {
		names = append(names, n)
	}
	sort.Strings(names)

	total, nsvc, nslice := 0, 0, 0
	for _, f := range s.files {
		total += len(f.good)
		for i := range f.good {
			if f.good[i].svc != nil {
				nsvc++
			} else if f.good[i].slice != nil {
				nslice++
			}
		}
	}
	var extra []model.Problem // merge and assign problems
	// winners finds duplicates. It is not kept: in-place edits skip this
	// merge (see incremental), and its ~2 MB at 10,000 Services would
	// stay on the heap.
	winners := make(map[objKey]int, total)
	order := make([]located, 0, total)
	for _, n := range names {
		f := s.files[n]
		problems = append(problems, f.problems...)
		for i := range f.good {
			e := &f.good[i]
			here := located{n, e}
			if i, dup := winners[e.key]; dup {
				first := order[i]
				extra = append(extra, model.Problem{Object: here.object(), File: here.file, Field: "metadata.name", Value: e.key.Name,
					Reason: fmt.Sprintf("duplicate of file %s %s; this copy is ignored", first.file, first.e.where)})
				continue
			}
			winners[e.key] = len(order)
			order = append(order, here)
		}
	}

	s.preassign(ctx, order)
	s.snaps++
	snap := &model.Snapshot{Gen: s.snaps}
	if nsvc > 0 {
		snap.Services = make([]*model.Service, 0, nsvc)
	}
	if nslice > 0 {
		snap.Slices = make([]*model.EndpointSlice, 0, nslice)
	}
	s.gen++
	for _, l := range order {
		switch {
		case l.e.svc != nil:
			svc, ps, ok := s.assign(ctx, l)
			extra = append(extra, ps...)
			if ok {
				snap.Services = append(snap.Services, svc)
			}
		case l.e.slice != nil:
			snap.Slices = append(snap.Slices, l.e.slice)
		case l.e.node != nil:
			snap.Node = l.e.node
		}
	}
	// The batch's results are in byService by now; kept, the map would
	// hold an entry per Service until the next merge.
	s.assigns.batch = nil
	for name, st := range s.assigns.byService {
		if st.gen == s.gen {
			continue
		}
		delete(s.assigns.byService, name)
		if s.opts.Assigner != nil {
			if err := s.opts.Assigner.Release(ctx, name); err != nil {
				s.log.Warn("cannot release addresses of a removed Service", "service", name.String(), "err", err)
			}
		}
	}

	problems = append(problems, extra...)

	slices.SortFunc(snap.Services, func(a, b *model.Service) int {
		return compareNames(a.ServiceName, b.ServiceName)
	})
	sort.Slice(snap.Slices, func(i, j int) bool {
		a, b := snap.Slices[i], snap.Slices[j]
		if a.Service.Namespace != b.Service.Namespace {
			return a.Service.Namespace < b.Service.Namespace
		}
		return a.Name < b.Name
	})
	if len(problems) > 0 {
		snap.Problems = problems
	}
	s.inc.built, s.inc.ok = snap, len(extra) == 0 && !dirTrouble
	return snap
}

// compareNames orders Service names as their String() forms
// ("namespace/name") compare, without building those strings.
func compareNames(a, b model.ServiceName) int {
	if a.Namespace == b.Namespace {
		return strings.Compare(a.Name, b.Name)
	}
	n := min(len(a.Namespace), len(b.Namespace))
	if c := strings.Compare(a.Namespace[:n], b.Namespace[:n]); c != 0 {
		return c
	}
	// One namespace is a prefix of the other: its "/" meets the longer
	// one's next byte.
	if len(a.Namespace) < len(b.Namespace) {
		if b.Namespace[n] == '/' {
			return strings.Compare(a.String(), b.String())
		}
		return cmp.Compare('/', b.Namespace[n])
	}
	if a.Namespace[n] == '/' {
		return strings.Compare(a.String(), b.String())
	}
	return cmp.Compare(a.Namespace[n], '/')
}

// preassign, when the Assigner can batch, assigns every Service that
// assign would send to the Assigner in one AssignAll call and keeps the
// results for assign to use.
func (s *Source) preassign(ctx context.Context, order []located) {
	s.assigns.batch = nil
	ba, ok := s.opts.Assigner.(source.BatchAssigner)
	if !ok {
		return
	}
	var todo []*model.Service
	if len(s.assigns.byService) == 0 {
		todo = make([]*model.Service, 0, len(order)/2) // a first read: most objects are Services
	}
	for _, l := range order {
		e := l.e
		if e.svc == nil {
			continue
		}
		prev := s.assigns.byService[e.svc.ServiceName]
		if prev != nil && prev.ok && !prev.retry && (prev.in == e.svc || model.ServiceEqual(prev.in, e.svc)) {
			continue
		}
		todo = append(todo, e.svc)
	}
	if len(todo) < 2 {
		return // one Service: assign's own call is as cheap
	}
	out, errs := ba.AssignAll(ctx, todo)
	s.assigns.batch = make(map[model.ServiceName]batchResult, len(todo))
	for i, svc := range todo {
		s.assigns.batch[svc.ServiceName] = batchResult{in: svc, out: out[i], err: errs[i]}
	}
}

// assignments caches the Assigner's results, so it is called only for
// Services that changed.
type assignments struct {
	byService map[model.ServiceName]*assignState
	// batch holds preassign's results for the snapshot being built.
	batch map[model.ServiceName]batchResult
}

// assignState remembers the last Assign call for a Service. It points at
// the decoded Service rather than copying it: decoded objects are never
// modified, and an unchanged file keeps them, so the same pointer means
// the same Service without a deep comparison.
type assignState struct {
	in  *model.Service // as converted from the manifest
	out *model.Service // as assigned (in itself without an Assigner); valid when ok
	ok  bool
	// retry is set when a changed Service failed to get addresses: out is
	// the last good version and Assign is tried again on the next read.
	retry bool
	// gen is the snapshot that last saw the Service (others are released).
	gen uint64
}

// batchResult is one Service's outcome of preassign: in is the decoded
// Service, out in itself when nothing was filled in.
type batchResult struct {
	in, out *model.Service
	err     error
}

// assign returns the Service as it goes into the snapshot, asking the
// Assigner only when the Service changed since the last call (or, after a
// failure, on every re-read so a freed address is picked up). ok is false
// when the Service cannot be used at all.
func (s *Source) assign(ctx context.Context, l located) (*model.Service, []model.Problem, bool) {
	in := *l.e.svc
	needsIP := !in.Headless && in.Type != model.TypeExternalName && len(in.ClusterIPs) == 0
	prev := s.assigns.byService[in.ServiceName]
	if s.opts.Assigner == nil {
		if prev == nil || prev.in != l.e.svc {
			s.assigns.byService[in.ServiceName] = &assignState{in: l.e.svc, out: l.e.svc, ok: true, gen: s.gen}
		} else {
			prev.gen = s.gen
		}
		if needsIP {
			return l.e.svc, []model.Problem{{Object: l.object(), File: l.file, Field: "spec.clusterIP",
				Reason: "no clusterIP and no allocator configured; set spec.clusterIP or give vipproxy a service IP range"}}, false
		}
		var ps []model.Problem
		if in.Type == model.TypeNodePort || in.Type == model.TypeLoadBalancer {
			for i, p := range in.Ports {
				if p.NodePort == 0 {
					ps = append(ps, model.Problem{Object: l.object(), File: l.file, Field: fmt.Sprintf("spec.ports[%d].nodePort", i),
						Reason: "no nodePort and no allocator configured; the port is reachable on its cluster IP only"})
				}
			}
		}
		return l.e.svc, ps, true
	}

	if prev != nil && prev.ok && !prev.retry && (prev.in == l.e.svc || model.ServiceEqual(prev.in, &in)) {
		prev.in, prev.gen = l.e.svc, s.gen
		return prev.out, nil, true
	}
	var res *model.Service
	var err error
	if r, ok := s.assigns.batch[in.ServiceName]; ok && r.in == l.e.svc {
		res, err = r.out, r.err
	} else {
		var out model.Service
		out, err = s.opts.Assigner.Assign(ctx, in)
		res = &out
	}
	if err == nil {
		if res != l.e.svc && model.ServiceEqual(res, &in) {
			// Nothing was filled in (the manifest names its addresses):
			// the decoded Service serves as both, instead of a second
			// copy of every Service (5.5 MB at 10,000).
			res = l.e.svc
		}
		s.assigns.byService[in.ServiceName] = &assignState{in: l.e.svc, out: res, ok: true, gen: s.gen}
		return res, nil, true
	}
	p := model.Problem{Object: l.object(), File: l.file, Reason: "cannot assign addresses: " + err.Error()}
	if prev != nil && prev.ok {
		// The last good assignment stays in force; retry on the next read.
		p.Reason += "; the last good version stays in force"
		s.assigns.byService[in.ServiceName] = &assignState{in: prev.in, out: prev.out, ok: true, retry: true, gen: s.gen}
		return prev.out, []model.Problem{p}, true
	}
	s.assigns.byService[in.ServiceName] = &assignState{in: l.e.svc, gen: s.gen}
	return l.e.svc, []model.Problem{p}, false
}

// errReason strips the path from an fs error (Problems name the file).
func errReason(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}
