package conntrack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
)

// Reconciler deletes stale UDP/SCTP conntrack entries. Call Reconcile
// after every successful Sync of a NAT-based dataplane (nftables,
// iptables, ipvs); the userspace mode needs none. The zero value is not
// usable: Table must be set.
type Reconciler struct {
	// Table is the conntrack table to clean (NetlinkTable, or Fake in tests).
	Table Table
	// Families are the address families to clean; empty means both.
	Families []model.AddressType
	// Options are passed to Stale.
	Options StaleOptions
	// Logger receives a debug line per round and errors; nil means
	// slog.Default().
	Logger *slog.Logger

	mu sync.Mutex // serializes Reconcile; guards ix
	// ix is the index of the State of the last Reconcile, updated
	// incrementally (see index.update).
	ix *index
}

// Reconcile lists each family's conntrack table, computes the entries st
// no longer justifies (see Stale) and deletes them. It observes
// metrics.ConntrackReconcileDuration (for each family, as kube-proxy's
// per-family reconcilers do) and adds the number deleted to
// metrics.ConntrackDeletedEntries{ip_family="IPv4"|"IPv6"}.
//
// When st has no UDP or SCTP Service port nothing can be stale and the
// table is not listed. A family whose List or Delete fails does not stop
// the other; the errors are joined and returned, prefixed "conntrack:".
// Reconcile is level-triggered: a round that failed is simply redone by
// the next call. It returns ctx.Err() without work if ctx is done.
//
// The Reconciler keeps its index of the previous State and recomputes
// only the ServicePorts whose pointer it has not seen before, so st and
// every ServicePort it holds must not be modified after the call (States
// are read-only; see dataplane.Dataplane.Sync). An unchanged State costs
// one pointer comparison per port before the table is listed. Calls are
// serialized.
func (r *Reconciler) Reconcile(ctx context.Context, st *model.State) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.Table == nil {
		return errors.New("conntrack: Reconciler has no Table")
	}
	log := r.Logger
	if log == nil {
		log = slog.Default()
	}
	start := time.Now()
	defer func() {
		for _, fam := range metrics.IPFamilies {
			metrics.ConntrackReconcileDuration.WithLabelValues(fam).Observe(time.Since(start).Seconds())
		}
	}()

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ix == nil {
		r.ix = &index{}
	}
	ix := r.ix
	ix.update(st)
	if ix.empty() {
		return nil
	}
	families := r.Families
	if len(families) == 0 {
		families = []model.AddressType{model.IPv4, model.IPv6}
	}
	var errs []error
	for _, fam := range families {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		flows, err := r.Table.List(fam)
		if err != nil {
			errs = append(errs, fmt.Errorf("conntrack: list %s: %w", fam, err))
			continue
		}
		stale := ix.stale(flows, r.Options)
		if len(stale) == 0 {
			log.Debug("conntrack reconciled", "ipFamily", fam, "entries", len(flows), "deleted", 0)
			continue
		}
		n, err := r.Table.Delete(stale)
		metrics.ConntrackDeletedEntries.WithLabelValues(familyLabel(fam)).Add(float64(n))
		if err != nil {
			errs = append(errs, fmt.Errorf("conntrack: delete %d stale %s entries (%d deleted): %w", len(stale), fam, n, err))
			continue
		}
		log.Debug("conntrack reconciled", "ipFamily", fam, "entries", len(flows), "stale", len(stale), "deleted", n,
			"took", time.Since(start))
	}
	if err := errors.Join(errs...); err != nil {
		log.Error("conntrack cleanup failed", "err", err)
		return err
	}
	return nil
}
