package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/vipproxy/vipproxy/internal/config"
)

// applyLogging configures logging exactly as kube-proxy does
// (logsapi.ValidateAndApply over the resolved logging section: klog's text
// format or component-base's JSON, -v, --vmodule, flush frequency, split
// streams) and returns the process logger. vipproxy logs through slog;
// its records go to the same klog backend client-go logs to, so there is
// one format and -v reaches client-go. slog levels map to klog's: Error →
// E, Warn → W, Info → I at V(0), and slog.Level(-n) → V(n).
func applyLogging(cfg *config.Config, stdout, stderr io.Writer) (*slog.Logger, error) {
	opts := &logsapi.LoggingOptions{ErrorStream: stderr, InfoStream: stdout}
	if err := logsapi.ValidateAndApplyWithOptions(&cfg.KubeProxy.Logging, opts, cfg.LoggingGate()); err != nil {
		return nil, fmt.Errorf("logging: %w", err)
	}
	// logsapi made slog's default a handler over klog.Background().
	log := slog.New(vmoduleHandler{slog.Default().Handler()})
	slog.SetDefault(log)
	return log, nil
}

// vmoduleHandler decides whether a V-level (below Info) record is logged
// by klog's -v and --vmodule for the file that called the slog.Logger
// method. The bridge it wraps would check the frame of its own caller
// (inside log/slog), so --vmodule=proxier=4 would never match vipproxy's
// files.
type vmoduleHandler struct{ slog.Handler }

// callerDepth is the number of frames between klog.VDepth's caller (this
// Enabled) and the code that logged: slog.(*Logger).Enabled, .log (or
// .logAttrs), the exported method (Info, Log, LogAttrs, ...), then the
// caller. TestLogging pins it.
const callerDepth = 4

func (h vmoduleHandler) Enabled(ctx context.Context, level slog.Level) bool {
	if level >= slog.LevelInfo {
		return h.Handler.Enabled(ctx, level)
	}
	return klog.VDepth(callerDepth, klog.Level(-level)).Enabled()
}

func (h vmoduleHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return vmoduleHandler{h.Handler.WithAttrs(attrs)}
}

func (h vmoduleHandler) WithGroup(name string) slog.Handler {
	return vmoduleHandler{h.Handler.WithGroup(name)}
}
