//go:build linux

package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Restart is what restarting a proxy with every Service programmed cost:
// a client connects through a ClusterIP every 10 ms from before the old
// process is stopped until a second after the new one is ready.
type Restart struct {
	Ready time.Duration // new process start → /healthz answers 200
	// Synced is new process start → the first sync of the new process
	// (kubeproxy_sync_proxy_rules_last_timestamp_seconds past its
	// start), the readiness both proxies report alike.
	Synced   time.Duration
	Connects int
	Failed   int
}

func (r Restart) String() string {
	if r.Connects == 0 {
		return "—"
	}
	return fmt.Sprintf("%s (synced %s), %d of %d connects failed", fmtDur(r.Ready), fmtDur(r.Synced), r.Failed, r.Connects)
}

// restart stops p, starts the same proxy (or cfg.RestartVipproxy) again in the same bed and measures
// it while a client connects to the last Service (a real one). It returns
// the new process (running, for the caller to stop) when it started.
func (cfg Config) restart(ctx context.Context, t Target, b *Bed, set *Set, manifests string, cp *ControlPlane, p *Proc) (Restart, *Proc, error) {
	var r Restart
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			_, err := b.Dialer().Connect(set.VIP(set.N-1), time.Second)
			mu.Lock()
			r.Connects++
			if err != nil {
				r.Failed++
			}
			mu.Unlock()
		}
	}()
	finish := func() {
		close(stop)
		wg.Wait()
	}
	time.Sleep(200 * time.Millisecond)
	p.Stop(10 * time.Second)
	next, err := cfg.proc(t, b, manifests, cp, fmt.Sprint(set.N)+"-restart")
	if err == nil {
		if cfg.RestartVipproxy != "" && t.Proxy != "kube-proxy" {
			next.Argv[0] = cfg.RestartVipproxy // an upgrade
		}
		keepStateDir(p, next)
		err = next.Start()
	}
	if err != nil {
		finish()
		return r, nil, err
	}
	// /healthz is polled while the new process starts; /metrics, whose
	// every scrape gathers every collector, is read once it is healthy:
	// the last-sync timestamp says when the sync was, however late it is
	// read. (Until 2026-12-08 /metrics was polled every 5 ms during the
	// restart, which took CPU from the process being measured.)
	deadline := time.Now().Add(cfg.Timeout)
	ready, err := waitHealthy(ctx, b, next, deadline)
	if err != nil {
		finish()
		return r, next, err
	}
	synced, err := waitSynced(ctx, b, next, deadline)
	if err != nil {
		finish()
		return r, next, err
	}
	time.Sleep(time.Second)
	finish()
	r.Ready, r.Synced = ready, synced
	return r, next, nil
}

// keepStateDir gives next the --state-dir of p, as a restart has it (a
// DaemonSet's hostPath, a systemd unit's directory): the standalone
// allocation map and manifest cache survive. (Before 2026-12-07 the
// restarted process got a fresh directory.)
func keepStateDir(p, next *Proc) {
	i, j := slices.Index(p.Argv, "--state-dir"), slices.Index(next.Argv, "--state-dir")
	if i >= 0 && j >= 0 && i+1 < len(p.Argv) && j+1 < len(next.Argv) {
		next.Argv[j+1] = p.Argv[i+1]
	}
}

// nodeHTTP is an HTTP client whose connections start in the bed's node
// namespace (where the proxies listen on 127.0.0.1).
func nodeHTTP(b *Bed) (*http.Client, func(), error) {
	d, err := NewDialer(b.Node)
	if err != nil {
		return nil, nil, err
	}
	return &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, _, err := d.Dial(addr, time.Second)
			return c, err
		}}}, func() { d.Close() }, nil
}

// syncMetric is the last-sync timestamp both proxies export on
// 127.0.0.1:10249/metrics.
const syncMetric = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"

// waitSynced reads the proxy's metrics until its last-sync timestamp is
// past p's start (every 20 ms) and returns that timestamp's distance from
// p's start.
func waitSynced(ctx context.Context, b *Bed, p *Proc, deadline time.Time) (time.Duration, error) {
	client, done, err := nodeHTTP(b)
	if err != nil {
		return 0, err
	}
	defer done()
	start := float64(p.Started().UnixNano()) / 1e9
	for {
		var last float64
		resp, err := client.Get("http://127.0.0.1:10249/metrics")
		if err == nil {
			body, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			last, err = lastSync(string(body)), rerr
		}
		if last >= start {
			return time.Duration((last - start) * float64(time.Second)), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil || !p.Running() {
			return 0, fmt.Errorf("restart: no sync seen (last: %v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lastSync is the largest value of syncMetric in a Prometheus text
// exposition (one sample per IP family), 0 when there is none.
func lastSync(text string) float64 {
	var last float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, syncMetric) {
			continue
		}
		rest := line[len(syncMetric):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // another metric with this prefix
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil && v > last {
			last = v
		}
	}
	return last
}

// waitHealthy polls the proxy's /healthz (127.0.0.1:10256 in the bed's node
// namespace) until it answers 200 and returns the time since p started.
func waitHealthy(ctx context.Context, b *Bed, p *Proc, deadline time.Time) (time.Duration, error) {
	client, done, err := nodeHTTP(b)
	if err != nil {
		return 0, err
	}
	defer done()
	for {
		resp, err := client.Get("http://127.0.0.1:10256/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(p.Started()), nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil || !p.Running() {
			return 0, fmt.Errorf("restart: not healthy (last: %v)", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
