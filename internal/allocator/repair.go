package allocator

import (
	"cmp"
	"context"
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Invalid is an assignment the repair loop refuses to touch: a value out
// of the configured ranges, or one held by more than one Service.
type Invalid struct {
	Kind     string // "out_of_range" or "duplicate"
	Resource string // "ip" or "port"
	Value    string
	Owners   []model.ServiceName
}

func (i Invalid) String() string {
	owners := make([]string, len(i.Owners))
	for k, o := range i.Owners {
		owners[k] = o.String()
	}
	return fmt.Sprintf("%s %s %s held by %s", i.Kind, i.Resource, i.Value, strings.Join(owners, ", "))
}

// RepairResult is what one repair pass saw and did.
type RepairResult struct {
	// Leaked are records held by no live Service, with how many
	// consecutive passes saw each (those released are included).
	Leaked map[model.ServiceName]int
	// Released are the records this pass deleted.
	Released []model.ServiceName
	// Invalid lists out-of-range and doubly held values.
	Invalid []Invalid
}

// Repair runs one repair pass against live, the Services that exist now
// (every Service using this store, not only this host's).
//
// A record whose Service is not live is a leak; it is released only when
// LeakThreshold consecutive passes saw it leaked, and never when Assign or
// Release touched that Service since the previous pass began (a racing
// creation). Values outside the configured ranges and values held by two
// Services are logged at error level and counted in
// vipproxy_allocator_invalid_assignments, never released or reassigned.
func (a *Assigner) Repair(ctx context.Context, live []model.ServiceName) (RepairResult, error) {
	// Names Assign touched since the previous pass began count as live.
	a.mu.Lock()
	touched := a.assigned
	a.assigned = map[model.ServiceName]bool{}
	a.mu.Unlock()

	m, err := a.store.Snapshot(ctx)
	if err != nil {
		return RepairResult{}, fmt.Errorf("allocator: repair: %w", err)
	}
	res := RepairResult{Leaked: map[model.ServiceName]int{}}
	res.Invalid = a.check(m)
	counts := map[[2]string]float64{}
	for _, inv := range res.Invalid {
		counts[[2]string{inv.Kind, inv.Resource}]++
		repairErrors.WithLabelValues(inv.Kind, inv.Resource).Inc()
		a.log.Error("invalid allocation; not repairing it automatically", "kind", inv.Kind, "resource", inv.Resource,
			"value", inv.Value, "owners", fmt.Sprint(inv.Owners))
	}
	for _, kind := range []string{"out_of_range", "duplicate"} {
		for _, res := range []string{"ip", "port"} {
			repairInvalid.WithLabelValues(kind, res).Set(counts[[2]string{kind, res}])
		}
	}

	isLive := make(map[model.ServiceName]bool, len(live))
	for _, n := range live {
		isLive[n] = true
	}
	a.mu.Lock()
	next := map[model.ServiceName]int{}
	var release []model.ServiceName
	m.Range(func(n model.ServiceName, _ Record) bool {
		if isLive[n] || touched[n] || a.assigned[n] {
			return true
		}
		c := a.leaks[n] + 1
		next[n] = c
		res.Leaked[n] = c
		if c >= a.threshold {
			release = append(release, n)
		}
		return true
	})
	slices.SortFunc(release, compareNames)
	a.leaks = next
	repairLeaked.Set(float64(len(next)))
	if len(release) == 0 {
		a.mu.Unlock()
		return res, nil
	}
	// Holding a.mu: no Assign runs while we release; skip any name Assign
	// or Release touched while we were reading the snapshot.
	release = slices.DeleteFunc(release, func(n model.ServiceName) bool { return a.assigned[n] })
	a.indexOK = false
	var released []model.ServiceName
	for chunk := range slices.Chunk(release, batchSize) {
		var done []model.ServiceName
		err = a.store.Update(ctx, func(cur *Map) error {
			done = done[:0]
			for _, n := range chunk {
				// Only the record we saw leaked: if another host
				// re-assigned the name since, it is not ours to release.
				was, _ := m.Get(n)
				if now, ok := cur.Get(n); ok && !now.equal(was) {
					continue
				}
				cur.Delete(n)
				done = append(done, n)
			}
			return nil
		})
		if err != nil {
			break
		}
		released = append(released, done...)
	}
	for _, n := range released {
		delete(a.leaks, n)
		r, _ := m.Get(n)
		a.log.Info("released leaked allocation", "service", n.String(), "clusterIPs", fmt.Sprint(r.ClusterIPs),
			"ports", fmt.Sprint(r.Ports()), "passes", res.Leaked[n])
	}
	res.Released = released
	repairReleased.Add(float64(len(released)))
	a.mu.Unlock()
	if err != nil {
		return res, fmt.Errorf("allocator: repair: release: %w", err)
	}
	return res, nil
}

// holding is one value a Service holds, for check.
type holding[T comparable] struct {
	v T
	n model.ServiceName
}

// runs yields the runs of hs that hold one value (hs sorted by value).
func runs[T comparable](hs []holding[T]) iter.Seq[[]holding[T]] {
	return func(yield func([]holding[T]) bool) {
		for i := 0; i < len(hs); {
			j := i + 1
			for j < len(hs) && hs[j].v == hs[i].v {
				j++
			}
			if !yield(hs[i:j]) {
				return
			}
			i = j
		}
	}
}

// owners names the Services of a run.
func owners[T comparable](run []holding[T]) []model.ServiceName {
	o := make([]model.ServiceName, len(run))
	for i, h := range run {
		o[i] = h.n
	}
	return o
}

// check finds out-of-range and doubly held values and updates the
// allocated gauges. Every held value is listed with its owner and the
// list sorted by value then owner (one allocation each for IPs and ports,
// rather than a map of owner lists: at 50,000 Services a pass, every
// minute, allocated 30 MB); a value's owners then sit together.
func (a *Assigner) check(m *Map) []Invalid {
	ips := make([]holding[netip.Addr], 0, m.Len())
	var ports []holding[uint16]
	m.Range(func(n model.ServiceName, r Record) bool {
		for _, ip := range r.ClusterIPs {
			ips = append(ips, holding[netip.Addr]{ip, n})
		}
		for _, p := range r.NodePorts {
			if p.NodePort != 0 {
				ports = append(ports, holding[uint16]{p.NodePort, n})
			}
		}
		if r.HealthCheckNodePort != 0 {
			ports = append(ports, holding[uint16]{r.HealthCheckNodePort, n})
		}
		return true
	})
	slices.SortFunc(ips, func(x, y holding[netip.Addr]) int { return cmp.Or(x.v.Compare(y.v), compareNames(x.n, y.n)) })
	slices.SortFunc(ports, func(x, y holding[uint16]) int { return cmp.Or(cmp.Compare(x.v, y.v), compareNames(x.n, y.n)) })
	// A Service holding one port twice (two of its ports, or one and its
	// health check port) holds it once.
	ports = slices.Compact(ports)
	var out []Invalid
	perFamily := map[model.AddressType]int{}
	inPorts := 0
	for run := range runs(ips) {
		ip := run[0].v
		ipr := a.ips[familyOf(ip)]
		if ipr == nil || !ipr.Contains(ip) {
			out = append(out, Invalid{Kind: "out_of_range", Resource: "ip", Value: ip.String(), Owners: owners(run)})
		} else {
			perFamily[familyOf(ip)]++
		}
		if len(run) > 1 {
			out = append(out, Invalid{Kind: "duplicate", Resource: "ip", Value: ip.String(), Owners: owners(run)})
		}
	}
	for run := range runs(ports) {
		p := run[0].v
		if !a.ports.Contains(p) {
			out = append(out, Invalid{Kind: "out_of_range", Resource: "port", Value: strconv.Itoa(int(p)), Owners: owners(run)})
		} else {
			inPorts++
		}
		if len(run) > 1 {
			out = append(out, Invalid{Kind: "duplicate", Resource: "port", Value: strconv.Itoa(int(p)), Owners: owners(run)})
		}
	}
	for f, r := range a.ips {
		allocated.WithLabelValues(r.Prefix().String()).Set(float64(perFamily[f]))
	}
	allocated.WithLabelValues(a.ports.String()).Set(float64(inPorts))
	return out
}

// RunRepair runs Repair every interval (and once at start) with the
// Services live returns, until ctx is done. A failing pass (live or the
// store failing) is logged and retried at the next tick; the loop only
// returns ctx's error.
func (a *Assigner) RunRepair(ctx context.Context, interval time.Duration, live func(context.Context) ([]model.ServiceName, error)) error {
	if interval <= 0 {
		interval = time.Minute
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		names, err := live(ctx)
		if err != nil {
			a.log.Warn("repair pass skipped: cannot list live Services", "err", err)
		} else if _, err := a.Repair(ctx, names); err != nil && ctx.Err() == nil {
			a.log.Warn("repair pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
