//go:build !linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/userspace"
	"github.com/vipproxy/vipproxy/internal/model"
)

// newDataplane builds the dataplane of mode. Off Linux only the userspace
// mode exists; the kernel modes are refused with a clear error.
func newDataplane(_ *config.Config, mode string, opts dataplane.Options) (dataplane.Dataplane, error) {
	if mode == config.ModeUserspace {
		return userspace.New(userspace.Options{Options: opts})
	}
	return nil, fmt.Errorf("proxy mode %q needs Linux; use --proxy-mode userspace", mode)
}

// afterSyncHooks: no conntrack off Linux.
func afterSyncHooks(*config.Config, string, []netip.Addr, *slog.Logger) []func(context.Context, *model.State) {
	return nil
}

// cleanupAll removes the userspace mode's addresses.
func cleanupAll(ctx context.Context, _ *config.Config, log *slog.Logger) error {
	dp, err := newDataplane(nil, config.ModeUserspace, dataplane.Options{Logger: log})
	if err != nil {
		return err
	}
	return dp.Cleanup(ctx)
}

// applyHostSettings: conntrack parameters exist on Linux only.
func applyHostSettings(*config.Config, *slog.Logger) {}

// ownAddrs: the userspace mode's loopback VIPs are Linux-only.
func ownAddrs() []netip.Addr { return nil }
