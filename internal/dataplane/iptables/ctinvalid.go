package iptables

import (
	"bufio"
	"bytes"
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ctInvalidDesc is kube-proxy's series for the packets its conntrack
// INVALID rule dropped (kube-proxy counts them with an nfacct object;
// vipproxy reads the packet counter of its own rule).
var ctInvalidDesc = prometheus.NewDesc("kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
	"packets dropped by iptables to work around conntrack problems", nil, nil)

// CTInvalidCollector is a prometheus.Collector reporting
// kubeproxy_iptables_ct_state_invalid_dropped_packets_total: the sum, over
// both families, of the packet counters of the rules in VIP-FORWARD that
// drop conntrack INVALID packets, read with `iptables -S -v` at each
// scrape (a family whose chain cannot be read counts 0). The zero value
// reads the system's iptables.
type CTInvalidCollector struct {
	Exec *Exec
}

// Describe implements prometheus.Collector.
func (c *CTInvalidCollector) Describe(ch chan<- *prometheus.Desc) { ch <- ctInvalidDesc }

// Collect implements prometheus.Collector.
func (c *CTInvalidCollector) Collect(ch chan<- prometheus.Metric) {
	e := c.Exec
	if e == nil {
		e = &Exec{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var total float64
	for _, fam := range []Family{IPv4, IPv6} {
		out, err := e.run(e.cmd(ctx, e.bin(fam, "tables"), "-w", e.wait(), "-t", TableFilter, "-S", chainForward, "-v"), nil)
		if err == nil {
			total += float64(invalidDropPackets(out))
		}
	}
	ch <- prometheus.MustNewConstMetric(ctInvalidDesc, prometheus.CounterValue, total)
}

// invalidDropPackets sums the packet counters ("-c PKTS BYTES") of the
// conntrack INVALID DROP rules in `iptables -S -v` output.
func invalidDropPackets(out []byte) uint64 {
	var n uint64
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "--ctstate INVALID") || !strings.HasSuffix(strings.TrimSpace(line), "-j DROP") {
			continue
		}
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "-c" {
				if v, err := strconv.ParseUint(f[i+1], 10, 64); err == nil {
					n += v
				}
				break
			}
		}
	}
	return n
}
