package ipvs

// Reading a client's ClientIP affinity entry back from the kernel (for
// explain): the persistence templates in IPVS's connection table.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/model"
)

var _ dataplane.AffinityReader = (*Proxier)(nil)

// ipvsConnFile is the connection table of the process's network namespace.
var ipvsConnFile = "/proc/self/net/ip_vs_conn"

// Affinity implements dataplane.AffinityReader: the persistence template
// of client on one of sp's virtual servers (ClusterIP, external, load
// balancer or node address, on sp's port or NodePort) whose real server is
// one of sp's endpoints; the one with the most time left.
func (p *Proxier) Affinity(_ context.Context, sp *model.ServicePort, client netip.Addr) (dataplane.AffinityEntry, bool, error) {
	if sp.AffinityTimeoutSeconds <= 0 {
		return dataplane.AffinityEntry{}, false, nil
	}
	f, err := os.Open(ipvsConnFile)
	if errors.Is(err, fs.ErrNotExist) {
		return dataplane.AffinityEntry{}, false, nil
	}
	if err != nil {
		return dataplane.AffinityEntry{}, false, fmt.Errorf("ipvs: affinity: %w", err)
	}
	defer f.Close()
	return templateOf(f, sp, client)
}

// templateOf reads an ip_vs_conn table ("Pro FromIP FPrt ToIP TPrt DestIP
// DPrt State Expires …", IPv4 addresses in hex, IPv6 ones in text, ports
// in hex) and returns client's persistence template (client port 0) for sp.
func templateOf(r io.Reader, sp *model.ServicePort, client netip.Addr) (dataplane.AffinityEntry, bool, error) {
	client = client.Unmap()
	frontend := func(a netip.Addr, port uint16) bool {
		if port == sp.Port || port == 0 {
			for _, set := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
				for _, v := range set {
					if v.Unmap() == a {
						return true
					}
				}
			}
		}
		return sp.NodePort != 0 && port == sp.NodePort
	}
	endpoint := func(ap netip.AddrPort) bool {
		for _, set := range [][]model.Endpoint{sp.ClusterEndpoints, sp.LocalEndpoints} {
			for _, e := range set {
				if e.IP.Unmap() == ap.Addr() && e.Port == ap.Port() {
					return true
				}
			}
		}
		return false
	}
	var best dataplane.AffinityEntry
	found := false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 9 || f[0] == "Pro" {
			continue
		}
		caddr, err1 := connAddr(f[1])
		cport, err2 := strconv.ParseUint(f[2], 16, 16)
		vaddr, err3 := connAddr(f[3])
		vport, err4 := strconv.ParseUint(f[4], 16, 16)
		daddr, err5 := connAddr(f[5])
		dport, err6 := strconv.ParseUint(f[6], 16, 16)
		secs, err7 := strconv.ParseUint(f[8], 10, 32)
		if err := errors.Join(err1, err2, err3, err4, err5, err6, err7); err != nil {
			return dataplane.AffinityEntry{}, false, fmt.Errorf("ip_vs_conn line %q: %w", sc.Text(), err)
		}
		dst := netip.AddrPortFrom(daddr, uint16(dport))
		if caddr != client || cport != 0 || !frontend(vaddr, uint16(vport)) || !endpoint(dst) {
			continue
		}
		left := time.Duration(secs) * time.Second
		if !found || left > best.Expires {
			best, found = dataplane.AffinityEntry{Endpoint: dst, Expires: left}, true
		}
	}
	return best, found, sc.Err()
}

// connAddr parses an ip_vs_conn address: 8 hex digits for IPv4, else text.
func connAddr(s string) (netip.Addr, error) {
	if len(s) == 8 && !strings.Contains(s, ":") {
		v, err := strconv.ParseUint(s, 16, 32)
		if err != nil {
			return netip.Addr{}, err
		}
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), nil
	}
	a, err := netip.ParseAddr(s)
	return a.Unmap(), err
}
