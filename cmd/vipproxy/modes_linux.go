package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/conntrack"
	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/dataplane/nftables"
	"github.com/vipproxy/vipproxy/internal/dataplane/userspace"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
)

// newDataplane builds the dataplane of mode. ipvs falls back to iptables,
// with one warning and a metric, because this build has no IPVS backend
// and the probe for kernel support is part of that backend.
func newDataplane(mode string, opts dataplane.Options) (dataplane.Dataplane, error) {
	switch mode {
	case config.ModeNFTables, "":
		return nftables.New(opts, &nftables.NFT{})
	case config.ModeIPTables:
		return iptables.New(iptables.Options{Options: opts})
	case config.ModeIPVS:
		opts.Log().Warn("IPVS is not available (no IPVS backend in this build, or the kernel lacks ip_vs); falling back to iptables mode",
			"requested", config.ModeIPVS, "running", config.ModeIPTables)
		metrics.ModeFallbacks.WithLabelValues(config.ModeIPVS, config.ModeIPTables).Inc()
		return iptables.New(iptables.Options{Options: opts})
	case config.ModeUserspace:
		return userspace.New(userspace.Options{Options: opts})
	}
	return nil, fmt.Errorf("unknown proxy mode %q", mode)
}

// afterSyncHooks returns what runs after every successful sync: stale
// conntrack cleanup for the NAT modes.
func afterSyncHooks(mode string, log *slog.Logger) []func(context.Context, *model.State) {
	if mode == config.ModeUserspace {
		return nil
	}
	table, err := conntrack.NewNetlinkTable()
	if err != nil {
		log.Warn("stale conntrack cleanup disabled", "err", err)
		return nil
	}
	r := &conntrack.Reconciler{Table: table, Logger: log.With("component", "conntrack")}
	return []func(context.Context, *model.State){func(ctx context.Context, st *model.State) {
		if err := r.Reconcile(ctx, st); err != nil {
			log.Warn("stale conntrack cleanup failed; retried after the next sync", "err", err)
		}
	}}
}

// cleanupAll removes what every mode ever installed, in both families,
// and succeeds when there is nothing to remove.
func cleanupAll(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	opts := dataplane.Options{Logger: log}
	var errs []error
	for _, mode := range []string{config.ModeNFTables, config.ModeIPTables, config.ModeUserspace} {
		dp, err := newDataplane(mode, opts)
		if err == nil {
			err = dp.Cleanup(ctx)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", mode, err))
			continue
		}
		log.Info("cleaned up", "mode", mode)
	}
	return errors.Join(errs...)
}
