//go:build linux

package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Restart is what restarting a proxy with every Service programmed cost:
// a client connects through a ClusterIP every 10 ms from before the old
// process is stopped until a second after the new one is ready.
type Restart struct {
	Ready    time.Duration // new process start → /healthz answers 200 (first sync done)
	Connects int
	Failed   int
}

func (r Restart) String() string {
	if r.Connects == 0 {
		return "—"
	}
	return fmt.Sprintf("%s, %d of %d connects failed", fmtDur(r.Ready), r.Failed, r.Connects)
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
		if cfg.RestartVipproxy != "" {
			next.Argv[0] = cfg.RestartVipproxy // an upgrade
		}
		err = next.Start()
	}
	if err != nil {
		finish()
		return r, nil, err
	}
	ready, err := waitHealthy(ctx, b, next, time.Now().Add(cfg.Timeout))
	if err != nil {
		finish()
		return r, next, err
	}
	time.Sleep(time.Second)
	finish()
	r.Ready = ready
	return r, next, nil
}

// waitHealthy polls the proxy's /healthz (127.0.0.1:10256 in the bed's node
// namespace) until it answers 200 and returns the time since p started.
func waitHealthy(ctx context.Context, b *Bed, p *Proc, deadline time.Time) (time.Duration, error) {
	d, err := NewDialer(b.Node)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, _, err := d.Dial(addr, time.Second)
			return c, err
		}}}
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
