package iptables

// Reading a client's ClientIP affinity entry back from the kernel (for
// explain): the xt_recent list each endpoint chain records its clients in
// (-m recent --name VIP-SEP-… --set).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/model"
)

var _ dataplane.AffinityReader = (*Proxier)(nil)

// xtRecentDir holds the xt_recent lists of the process's network namespace.
var xtRecentDir = "/proc/self/net/xt_recent"

// Affinity implements dataplane.AffinityReader: the recent list of each of
// sp's endpoint chains (in client's family) is searched for client. The
// time left is computed from the entry's last_seen and the kernel's
// jiffies clock when both can be read; otherwise it is 0 (unknown).
func (p *Proxier) Affinity(_ context.Context, sp *model.ServicePort, client netip.Addr) (dataplane.AffinityEntry, bool, error) {
	if sp.AffinityTimeoutSeconds <= 0 {
		return dataplane.AffinityEntry{}, false, nil
	}
	client = client.Unmap()
	spn := sp.Name.String()
	var best dataplane.AffinityEntry
	var bestSeen uint64
	found := false
	for _, e := range dataplane.AffinityEndpoints(sp, client) {
		f, err := os.Open(xtRecentDir + "/" + endpointChain(spn, string(sp.Protocol), e))
		if errors.Is(err, fs.ErrNotExist) {
			continue // no client yet (or xt_recent not loaded)
		}
		if err != nil {
			return dataplane.AffinityEntry{}, false, fmt.Errorf("iptables: affinity: %w", err)
		}
		last, ok, err := recentLastSeen(f, client)
		f.Close()
		if err != nil {
			return dataplane.AffinityEntry{}, false, fmt.Errorf("iptables: affinity: %w", err)
		}
		// The kernel keeps entries past their time (--reap prunes
		// lazily): the latest one decides, as --rcheck would.
		if ok && (!found || last > bestSeen) {
			best, bestSeen, found = dataplane.AffinityEntry{Endpoint: netip.AddrPortFrom(e.IP.Unmap(), e.Port)}, last, true
		}
	}
	if !found {
		return best, false, nil
	}
	if now, hz, ok := kernelJiffies(); ok {
		left := time.Duration(sp.AffinityTimeoutSeconds)*time.Second - time.Duration(float64(now-bestSeen)/float64(hz)*float64(time.Second))
		if left <= 0 {
			return dataplane.AffinityEntry{}, false, nil // expired: --rcheck --seconds would not match
		}
		best.Expires = left
	}
	return best, true, nil
}

// recentLastSeen reads an xt_recent list ("src=ADDR ttl: T last_seen: J
// oldest_pkt: …" per line) and returns client's last_seen, in jiffies.
func recentLastSeen(r io.Reader, client netip.Addr) (uint64, bool, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || !strings.HasPrefix(f[0], "src=") || f[3] != "last_seen:" {
			continue
		}
		a, err := netip.ParseAddr(strings.TrimPrefix(f[0], "src="))
		if err != nil || a.Unmap() != client {
			continue
		}
		j, err := strconv.ParseUint(f[4], 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("xt_recent line %q: %w", sc.Text(), err)
		}
		return j, true, nil
	}
	return 0, false, sc.Err()
}

// kernelJiffies returns the kernel's jiffies counter (/proc/timer_list)
// and its rate HZ, inferred from the uptime: jiffies start 300 s before
// wrapping 32 bits (INITIAL_JIFFIES), so jiffies − 2³² = (uptime − 300)·HZ.
// ok is false when either cannot be read, or in the first minutes after
// boot, where the inference is unsure.
func kernelJiffies() (jiffies uint64, hz int, ok bool) {
	tl, err := os.Open("/proc/timer_list")
	if err != nil {
		return 0, 0, false
	}
	defer tl.Close()
	sc := bufio.NewScanner(tl)
	for sc.Scan() {
		if v, found := strings.CutPrefix(sc.Text(), "jiffies: "); found {
			jiffies, err = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, 0, false
			}
			break
		}
	}
	up, err := os.ReadFile("/proc/uptime")
	if err != nil || jiffies == 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(up))
	if len(f) == 0 {
		return 0, 0, false
	}
	secs, err := strconv.ParseFloat(f[0], 64)
	if err != nil || secs < 600 {
		return 0, 0, false
	}
	hz, ok = nearestHZ(float64(jiffies-(1<<32)) / (secs - 300))
	return jiffies, hz, ok
}

// nearestHZ returns the configurable kernel HZ value within 5 % of rate.
func nearestHZ(rate float64) (int, bool) {
	for _, hz := range []int{100, 250, 300, 1000} {
		if math.Abs(rate-float64(hz)) < 0.05*float64(hz) {
			return hz, true
		}
	}
	return 0, false
}
