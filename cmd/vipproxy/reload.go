package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/metrics"
)

// reloadDebounce is how long the config file must be quiet before it is
// re-read (editors and ConfigMap updates write in several steps).
const reloadDebounce = 300 * time.Millisecond

// reloader applies a changed --config file to the running proxy.
type reloader struct {
	path  string
	proxy *proxy
	log   *slog.Logger
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
	running := r.proxy.cfg.Load()
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
	for _, w := range next.Warnings {
		r.log.Warn("configuration: " + w)
	}
	if next.Mode() != config.ModeUserspace {
		applyHostSettings(next, r.log)
	}
	if err := r.proxy.switchTo(ctx, next, r.proxy.currentNodeAddrs()); err != nil {
		metrics.ConfigReloads.WithLabelValues("rejected").Inc()
		r.log.Error("config reload could not be applied; the running configuration stays", "err", err)
		return
	}
	r.proxy.cfg.Store(next)
	metrics.ConfigReloads.WithLabelValues("applied").Inc()
}
