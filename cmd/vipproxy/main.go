// Command vipproxy gives Kubernetes Services their virtual IPs: a drop-in
// kube-proxy. This package only wires: flags and config → source → model →
// reconcile loop → dataplane, plus the health and metrics servers.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/vipproxy/vipproxy/internal/config"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the exit: it returns the process exit code. Every
// configuration problem is reported before anything is programmed, with
// exit code 1.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "explain" {
		return runExplain(args[1:], stdout, stderr)
	}
	cfg, err := config.Parse(args, stdout)
	if errors.Is(err, config.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "vipproxy: %v\n", err)
		return 1
	}
	if err := cfg.Validate(config.OSHost{}); err != nil {
		fmt.Fprintf(stderr, "vipproxy: invalid configuration:\n%v\n", err)
		return 1
	}
	if cfg.WriteConfigTo != "" {
		if err := config.WriteConfigFile(cfg.WriteConfigTo, cfg); err != nil {
			fmt.Fprintf(stderr, "vipproxy: %v\n", err)
			return 1
		}
		return 0
	}
	log, err := applyLogging(cfg, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "vipproxy: %v\n", err)
		return 1
	}
	defer klog.Flush()
	logConfigWarnings(log, cfg)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if cfg.InitOnly {
		// What needs full root privileges, as kube-proxy's --init-only.
		applyHostSettings(cfg, log)
		log.Info("init-only: host settings applied; exiting")
		return 0
	}
	if cfg.Cleanup {
		if err := cleanupAll(ctx, cfg, log); err != nil {
			log.Error("cleanup incomplete", "err", err)
			return 1
		}
		return 0
	}
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("vipproxy stopped", "err", err)
		return 1
	}
	return 0
}

// logConfigWarnings logs what Parse and Validate found that does not stop
// vipproxy: unknown fields of the config file (ignored, as kube-proxy
// does), feature gates of other components, deprecated flags, flags a
// --config file overrides.
func logConfigWarnings(log *slog.Logger, cfg *config.Config) {
	for _, w := range cfg.Warnings {
		log.Warn("configuration: " + w)
	}
	if len(cfg.IgnoredFlags) > 0 {
		log.Warn("configuration: these flags are ignored because --config is given (as kube-proxy ignores them)", "flags", cfg.IgnoredFlags)
	}
}
