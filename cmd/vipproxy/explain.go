package main

// `vipproxy explain` and the metrics server's /explain: which endpoints a
// connection to a Service address can reach, and why the others cannot
// (model.Explain), with the live connections per endpoint from conntrack.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/conntrack"
	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/model"
)

// errNotReady: the dataplane has not been programmed yet.
var errNotReady = errors.New("starting: the dataplane is not programmed yet")

// explain answers q from the running State and the node's conntrack table.
func (p *proxy) explain(q model.Query) (*model.Explanation, error) {
	loop := p.running.Load()
	if loop == nil {
		return nil, errNotReady
	}
	st := loop.LastState()
	p.mu.Lock()
	opts := p.opts
	p.mu.Unlock()
	userspace := loop.Dataplane().Mode() == config.ModeUserspace
	o := model.ExplainOptions{ClusterCIDRs: opts.ClusterCIDRs, NodeIPs: opts.NodeIPs, MasqueradeAll: opts.MasqueradeAll, Proxied: userspace}
	if r, ok := loop.Dataplane().(dataplane.AffinityReader); ok {
		o.Affinity = func(sp *model.ServicePort, src netip.Addr) (netip.AddrPort, time.Duration, bool, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			e, ok, err := r.Affinity(ctx, sp, src)
			return e.Endpoint, e.Expires, ok, err
		}
	}
	if p.ejector != nil {
		o.Ejected = map[netip.AddrPort]string{}
		for ep, e := range p.ejector.ejections() {
			o.Ejected[ep] = "ejected until " + e.Until.Format(time.RFC3339) + ": " + e.Reason
		}
	}
	x := model.Explain(st, q, o)
	if len(x.Endpoints) > 0 {
		t, err := conntrack.NewNetlinkTable()
		if err == nil {
			defer t.Close()
			family := model.IPv4
			if q.Dst.Addr().Unmap().Is6() {
				family = model.IPv6
			}
			if flows, err := t.List(family); err == nil {
				countConnections(x, flows, q.Dst, userspace)
			}
		}
	}
	return x, nil
}

// countConnections fills x's endpoints' Connections with the live
// conntrack flows to them through dst: flows DNATed from dst to the
// endpoint in the netfilter modes; in userspace mode, where the proxy
// opens its own connection to the endpoint, every flow to the endpoint
// from this node (other Services' proxies included).
func countConnections(x *model.Explanation, flows []conntrack.Flow, dst netip.AddrPort, userspace bool) {
	count := map[netip.AddrPort]int{}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	for _, f := range flows {
		if !f.Live() {
			continue
		}
		switch {
		case !userspace && f.OrigDst == dst && f.ReplySrc != f.OrigDst:
			count[f.ReplySrc]++
		case userspace && f.ReplySrc == f.OrigDst:
			count[f.OrigDst]++
		}
	}
	for i := range x.Endpoints {
		ap, err := netip.ParseAddrPort(x.Endpoints[i].Endpoint)
		if err != nil {
			continue
		}
		x.Endpoints[i].Connections = count[ap]
	}
}

// parseQuery reads "VIP:PORT[/PROTO]" and an optional source address.
func parseQuery(target, from string) (model.Query, error) {
	var q model.Query
	addr, proto, _ := strings.Cut(target, "/")
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return q, fmt.Errorf("address %q: want IP:PORT or [IPv6]:PORT: %w", addr, err)
	}
	q.Dst = ap
	switch strings.ToUpper(proto) {
	case "", "TCP":
		q.Proto = model.TCP
	case "UDP":
		q.Proto = model.UDP
	case "SCTP":
		q.Proto = model.SCTP
	default:
		return q, fmt.Errorf("protocol %q: want tcp, udp or sctp", proto)
	}
	if from != "" {
		if q.Src, err = netip.ParseAddr(from); err != nil {
			return q, fmt.Errorf("--from %q: %w", from, err)
		}
	}
	return q, nil
}

// explainHandler serves /explain?dst=IP:PORT&proto=TCP&from=IP as JSON.
func explainHandler(explain func(model.Query) (*model.Explanation, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := r.URL.Query()
		target := v.Get("dst")
		if p := v.Get("proto"); p != "" {
			target += "/" + p
		}
		q, err := parseQuery(target, v.Get("from"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		x, err := explain(q)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(x)
	}
}

// runExplain is `vipproxy explain VIP:PORT[/PROTO] [--from SRC-IP]`: it asks
// the running instance's metrics server and prints the answer.
func runExplain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("vipproxy explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	from := fs.String("from", "", "the client's address (default: any client)")
	addr := fs.String("metrics-address", "127.0.0.1:10249", "the running vipproxy's metrics server (its --metrics-bind-address)")
	asJSON := fs.Bool("json", false, "print the JSON the /explain endpoint returns")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vipproxy explain VIP:PORT[/PROTO] [--from SRC-IP] [--metrics-address HOST:PORT] [--json]")
		fs.PrintDefaults()
	}
	// Flags may follow the address.
	var target string
	rest := args
	for len(rest) > 0 {
		if err := fs.Parse(rest); err != nil {
			return 2
		}
		rest = fs.Args()
		if len(rest) > 0 {
			if target != "" {
				fs.Usage()
				return 2
			}
			target, rest = rest[0], rest[1:]
		}
	}
	if target == "" {
		fs.Usage()
		return 2
	}
	q, err := parseQuery(target, *from)
	if err != nil {
		fmt.Fprintf(stderr, "vipproxy explain: %v\n", err)
		return 2
	}
	x, raw, err := fetchExplain(*addr, q)
	if err != nil {
		fmt.Fprintf(stderr, "vipproxy explain: %v\n", err)
		return 1
	}
	if *asJSON {
		_, _ = stdout.Write(raw)
		return 0
	}
	fmt.Fprint(stdout, x.Text())
	return 0
}

// fetchExplain asks the metrics server at addr.
func fetchExplain(addr string, q model.Query) (*model.Explanation, []byte, error) {
	v := url.Values{"dst": {q.Dst.String()}, "proto": {string(q.Proto)}}
	if q.Src.IsValid() {
		v.Set("from", q.Src.String())
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics-address %q: %w", addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	u := "http://" + net.JoinHostPort(host, port) + "/explain?" + v.Encode()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("is vipproxy running with its metrics server on %s? %w", addr, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(raw)))
	}
	var x model.Explanation
	if err := json.Unmarshal(raw, &x); err != nil {
		return nil, nil, fmt.Errorf("decode %s: %w", u, err)
	}
	return &x, raw, nil
}
