package ipvs

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/vipproxy/vipproxy/internal/dataplane"
)

// verifyDestsPerCheck bounds the virtual servers whose real servers one
// Verify reads (one netlink dump each); the window moves on at every
// check, so all are covered in turn.
const verifyDestsPerCheck = 1000

var _ dataplane.Verifier = (*Proxier)(nil)

// Verify implements dataplane.Verifier: every virtual server the last
// sync left must still be in the kernel with its scheduler, flags and
// timeout (one dump of all services), and the real servers and weights
// of up to verifyDestsPerCheck of them (a window that moves on at each
// check) must be as written. Someone running `ipvsadm -D` or `-d` by hand
// is repaired by the next periodic sync, not at the hourly rewrite.
// Before the first sync, or when a full sync is due anyway, it checks
// nothing.
func (p *Proxier) Verify(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.needFull || len(p.applied) == 0 {
		return nil
	}
	svcs, err := p.opts.Kernel.Services()
	if err != nil {
		return fmt.Errorf("ipvs: verify: %w", err)
	}
	have := make(map[ServiceKey]VirtualServer, len(svcs))
	for _, vs := range svcs {
		have[vs.ServiceKey] = vs
	}
	var diffs []string
	keys := slices.SortedFunc(maps.Keys(p.applied), ServiceKey.Compare)
	for _, k := range keys {
		vs, ok := have[k]
		switch {
		case !ok:
			diffs = append(diffs, "virtual server "+k.String()+" missing")
		case !vs.equal(p.applied[k].vs):
			diffs = append(diffs, "virtual server "+k.String()+" is "+vs.String()+", want "+p.applied[k].vs.String())
		}
	}
	n := min(verifyDestsPerCheck, len(keys))
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := keys[(p.verifyNext+i)%len(keys)]
		if _, ok := have[k]; !ok {
			continue
		}
		ds, err := p.opts.Kernel.Destinations(k)
		if err != nil {
			return fmt.Errorf("ipvs: verify %s: %w", k, err)
		}
		got := make(map[netip.AddrPort]RealServer, len(ds))
		for _, rs := range ds {
			got[rs.AddrPort()] = rs
		}
		if !sameDests(got, p.applied[k].dests) {
			diffs = append(diffs, fmt.Sprintf("virtual server %s has %d real servers, want %d (or other weights)", k, len(got), len(p.applied[k].dests)))
		}
	}
	p.verifyNext = (p.verifyNext + n) % max(len(keys), 1)
	return dataplane.DriftError(diffs)
}
