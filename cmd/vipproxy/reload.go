package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/reconcile"
)

// reloadDebounce is how long the config file must be quiet before it is
// re-read (editors and ConfigMap updates write in several steps).
const reloadDebounce = 300 * time.Millisecond

// reloader applies a changed --config file to the running proxy.
type reloader struct {
	path     string
	cfg      *atomic.Pointer[config.Config]
	loop     *reconcile.Loop
	nodeName string
	log      *slog.Logger
}

// watch re-reads the config file whenever it changes until ctx is done.
// It watches the file's directory, so replacing the file (editors' rename,
// a ConfigMap's symlink swap) is seen too.
func (r *reloader) watch(ctx context.Context) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		r.log.Error("config reload disabled: cannot watch", "file", r.path, "err", err)
		return
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(r.path)); err != nil {
		r.log.Error("config reload disabled: cannot watch", "file", r.path, "err", err)
		return
	}
	last, _ := os.ReadFile(r.path)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-w.Errors:
			r.log.Warn("config watch error", "err", err)
		case <-w.Events:
			timer.Reset(reloadDebounce)
		case <-timer.C:
			cur, err := os.ReadFile(r.path)
			if err == nil && slices.Equal(cur, last) {
				continue
			}
			last = cur
			r.reload(ctx)
		}
	}
}

// reload decodes and validates the file and, when valid, applies it. An
// invalid file is rejected with the field named; the running config stays.
func (r *reloader) reload(ctx context.Context) {
	running := r.cfg.Load()
	next, err := config.Reload(r.path, running)
	if err != nil {
		metrics.ConfigReloads.WithLabelValues("rejected").Inc()
		r.log.Error("config reload rejected; the running configuration stays", "file", r.path, "err", err)
		return
	}
	changes := config.Changes(running, next)
	if len(changes) == 0 {
		return
	}
	r.log.Info("config reload", "file", r.path, "changed", changes)
	if err := r.apply(ctx, running, next); err != nil {
		metrics.ConfigReloads.WithLabelValues("rejected").Inc()
		r.log.Error("config reload could not be applied; the running configuration stays", "err", err)
		return
	}
	r.cfg.Store(next)
	metrics.ConfigReloads.WithLabelValues("applied").Inc()
}

// apply switches to next. Periods change in place. Anything the dataplane
// was built from (mode, masquerading, nodePortAddresses, scheduler, …)
// builds a new dataplane, which programs everything before the old one is
// cleaned up, so no VIP is left unserved in between.
func (r *reloader) apply(ctx context.Context, running, next *config.Config) error {
	if next.Mode() != config.ModeUserspace {
		applyHostSettings(next, r.log)
	}
	oldOpts, _, err := dataplaneOptions(running, r.nodeName, r.log)
	if err != nil {
		return err
	}
	newOpts, _, err := dataplaneOptions(next, r.nodeName, r.log)
	if err != nil {
		return err
	}
	r.loop.SetPeriods(next.MinSyncPeriod(), next.SyncPeriod())
	if next.Mode() == running.Mode() && sameOptions(oldOpts, newOpts) {
		return nil
	}
	dp, err := newDataplane(next.Mode(), newOpts)
	if err != nil {
		return err
	}
	old := r.loop.Dataplane()
	r.loop.SetDataplane(dp)
	waitCtx, cancel := context.WithTimeout(ctx, 2*next.SyncPeriod()+30*time.Second)
	defer cancel()
	if err := r.loop.WaitSynced(waitCtx, dp); err != nil {
		// Keep serving with whatever is programmed; the loop retries the new
		// dataplane, and the old rules stay until it succeeds.
		r.log.Error("new dataplane has not synced yet; old rules kept", "mode", dp.Mode(), "err", err)
		return nil
	}
	metrics.ModeInfo.Reset()
	metrics.ModeInfo.WithLabelValues(dp.Mode(), next.Mode()).Set(1)
	if old.Mode() != dp.Mode() {
		if err := old.Cleanup(ctx); err != nil {
			r.log.Error("cleanup of the previous mode failed", "mode", old.Mode(), "err", err)
		}
	}
	r.log.Info("dataplane switched", "from", old.Mode(), "to", dp.Mode())
	return nil
}
