package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/reconcile"
)

// TestHealthzBeforeFirstSync: a vipproxy that cannot reach its API server
// has programmed nothing, so /healthz is 503 (the node is not Ready)
// while /livez is 200 (restarting would not help). Userspace mode, so the
// test touches nothing of the host's.
func TestHealthzBeforeFirstSync(t *testing.T) {
	// The dead API server's listener first: a port picked by closing a
	// listener can be the next one handed out, and then /healthz went to
	// the API server, which never answers (the test hung once in CI).
	dir, kc, closeAPI := deadAPIServer(t)
	defer closeAPI()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	healthz := l.Addr().String()
	l.Close()
	cfg, err := config.Parse([]string{"--kubeconfig", kc, "--proxy-mode", "userspace", "--hostname-override", "n1",
		"--healthz-bind-address", healthz, "--metrics-bind-address", "", "--state-dir", dir}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	defer func() { cancel(); <-done }()
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(path string) int {
		resp, err := client.Get("http://" + healthz + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	deadline := time.Now().Add(10 * time.Second)
	for get("/livez") == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if code := get("/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("/healthz before the first sync = %d, want 503", code)
	}
	if code := get("/livez"); code != http.StatusOK {
		t.Errorf("/livez before the first sync = %d, want 200", code)
	}
}

// TestBindAddressHardFail: with --bind-address-hard-fail a health port
// that cannot be bound stops vipproxy, as in kube-proxy; without it
// vipproxy keeps retrying. The metrics server answers /healthz with "ok".
func TestBindAddressHardFail(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	// A source that never delivers a snapshot (an API server that never
	// answers): serve builds no dataplane, so this test touches nothing of
	// the host's network namespace.
	dir, kc, closeAPI := deadAPIServer(t)
	defer closeAPI()
	for _, hard := range []bool{true, false} {
		args := []string{"--kubeconfig", kc, "--proxy-mode", "userspace", "--hostname-override", "n1",
			"--healthz-bind-address", busy.Addr().String(), "--metrics-bind-address", "", "--state-dir", dir}
		if hard {
			args = append(args, "--bind-address-hard-fail")
		}
		cfg, err := config.Parse(args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err = serve(ctx, cfg, slog.New(slog.DiscardHandler))
		cancel()
		if hard && (err == nil || !strings.Contains(err.Error(), "bind-address-hard-fail")) {
			t.Errorf("hard fail: serve = %v, want the bind error", err)
		}
		if !hard && err != nil {
			t.Errorf("soft: serve = %v, want nil (retrying)", err)
		}
	}
}

func TestMetricsServerHealthz(t *testing.T) {
	var cfg atomic.Pointer[config.Config]
	cfg.Store(config.Default())
	rec := httptest.NewRecorder()
	metricsHandler(&cfg, new(atomic.Pointer[reconcile.Loop]), nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "ok" {
		t.Errorf("metrics /healthz = %d %q, want 200 ok", rec.Code, rec.Body.String())
	}
}

// TestMetricsServerBeforeDataplane: the metrics server answers while the
// source syncs, before any dataplane exists: /metrics and /configz as
// always, /services with no Service, and /proxyMode 503 (no mode runs yet:
// an IPVS fallback decides it later).
func TestMetricsServerBeforeDataplane(t *testing.T) {
	var cfg atomic.Pointer[config.Config]
	cfg.Store(config.Default())
	h := metricsHandler(&cfg, new(atomic.Pointer[reconcile.Loop]), nil)
	for _, tc := range []struct {
		path string
		code int
		body string // a substring
	}{
		{"/metrics", http.StatusOK, "# TYPE"},
		{"/configz", http.StatusOK, "kubeproxy.config.k8s.io"},
		{"/services", http.StatusOK, "[]"},
		{"/proxyMode", http.StatusServiceUnavailable, "not programmed yet"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
		if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.body) {
			t.Errorf("%s = %d %q, want %d with %q", tc.path, rec.Code, rec.Body.String(), tc.code, tc.body)
		}
	}
}

// deadAPIServer returns a state dir, and a kubeconfig naming an API server
// on loopback that accepts connections and never answers: vipproxy then
// never gets its first snapshot and programs nothing.
func deadAPIServer(t *testing.T) (dir, kubeconfig string, closeFn func()) {
	t.Helper()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://`+dead.Addr().String()+`"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, kubeconfig, func() { dead.Close() }
}

// TestGathererHasComponentBase: /metrics carries kubernetes_build_info and
// client-go's rest_client series (once a request was made) from
// component-base, as kube-proxy's does, and no family twice.
func TestGathererHasComponentBase(t *testing.T) {
	fams, err := metricsGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range fams {
		if seen[f.GetName()] {
			t.Errorf("family %s gathered twice", f.GetName())
		}
		seen[f.GetName()] = true
	}
	for _, want := range []string{"kubernetes_build_info", "go_goroutines", "process_cpu_seconds_total"} {
		if !seen[want] {
			t.Errorf("no %s in /metrics", want)
		}
	}
}
