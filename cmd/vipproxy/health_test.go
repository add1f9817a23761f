package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/config"
)

// TestHealthzBeforeFirstSync: a vipproxy that cannot reach its API server
// has programmed nothing, so /healthz is 503 (the node is not Ready)
// while /livez is 200 (restarting would not help). Userspace mode, so the
// test touches nothing of the host's.
func TestHealthzBeforeFirstSync(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	healthz := l.Addr().String()
	l.Close()
	dead, err := net.Listen("tcp", "127.0.0.1:0") // an API server that never answers
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://`+dead.Addr().String()+`"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]string{"--kubeconfig", kc, "--proxy-mode", "userspace", "--hostname-override", "n1",
		"--healthz-bind-address", healthz, "--metrics-bind-address", "", "--state-dir", dir}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	defer func() { cancel(); <-done }()
	get := func(path string) int {
		resp, err := http.Get("http://" + healthz + path)
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
