package main

import (
	"bytes"
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/vipproxy/vipproxy/internal/config"
)

// TestLogging applies logging once for the process (logsapi allows one
// application) and checks what an operator of kube-proxy expects: klog's
// text header on every line, W and E severities, -v for V-levels, and
// --vmodule matching the file that logged through slog, with client-go's
// klog calls in the same stream.
func TestLogging(t *testing.T) {
	cfg, err := config.Parse([]string{"--manifests", t.TempDir(), "-v=1", "--vmodule=logging_test=4"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	log, err := applyLogging(cfg, &out, &out)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("info line", "service", "default/web")
	log.Warn("warn line")
	log.Error("error line", "err", "boom")
	log.Log(context.Background(), slog.Level(-4), "v4 here, vmodule matches")
	log.Log(context.Background(), slog.Level(-5), "v5 here, above vmodule")
	logAt(log, -1, "v1 elsewhere, -v=1")
	logAt(log, -2, "v2 elsewhere, above -v")
	log.With("component", "kube").Log(context.Background(), slog.Level(-3), "v3 through With")
	klog.V(4).InfoS("klog v4 here")
	klog.Flush()

	got := out.String()
	header := `\d{4} \d\d:\d\d:\d\d\.\d{6}\s+\d+ `
	for _, want := range []string{
		`(?m)^I` + header + `logging_test\.go:\d+\] "info line" service="default/web"$`,
		`(?m)^W` + header + `logging_test\.go:\d+\] "warn line"$`,
		`(?m)^E` + header + `logging_test\.go:\d+\] "error line" err="boom"$`,
		`(?m)^I` + header + `logging_test\.go:\d+\] "v4 here, vmodule matches"$`,
		`(?m)^I` + header + `logging_helper_test\.go:\d+\] "v1 elsewhere, -v=1"$`,
		`(?m)^I` + header + `logging_test\.go:\d+\] "v3 through With" component="kube"$`,
		`(?m)^I` + header + `logging_test\.go:\d+\] "klog v4 here"$`,
	} {
		if !regexp.MustCompile(want).MatchString(got) {
			t.Errorf("no line matching %s in:\n%s", want, got)
		}
	}
	for _, not := range []string{"v5 here", "v2 elsewhere"} {
		if strings.Contains(got, not) {
			t.Errorf("%q logged, beyond -v=1 --vmodule=logging_test=4:\n%s", not, got)
		}
	}
}
