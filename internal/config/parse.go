package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vipproxy/vipproxy/internal/model"
)

func itoa(i int) string { return strconv.Itoa(i) }

// parseCIDRs parses a comma-separated list of any number of CIDRs (blank
// entries skipped), each as model.ParsePrefixStrict does.
func parseCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		p, err := model.ParsePrefixStrict(part)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// parsePrefixList parses a comma-separated list of at most two CIDRs, at
// most one per IP family (a dual-stack pair), each as Kubernetes'
// ParseCIDRSloppy does (host bits masked off). Empty input gives nil.
func parsePrefixList(s string) ([]netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return nil, fmt.Errorf("at most two CIDRs (one IPv4, one IPv6) are allowed, got %d", len(parts))
	}
	var out []netip.Prefix
	for _, part := range parts {
		p, err := model.ParsePrefix(strings.TrimSpace(part))
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if len(out) == 2 && out[0].Addr().Is4() == out[1].Addr().Is4() {
		return nil, errors.New("two CIDRs must be one IPv4 and one IPv6 (a dual-stack pair)")
	}
	return out, nil
}

// parsePortRange parses "lo-hi", "lo+n" (lo to lo+n) or a single port, as
// Kubernetes' PortRange does, and requires 1 ≤ lo ≤ hi ≤ 65535.
func parsePortRange(s string) (lo, hi uint16, err error) {
	s = strings.TrimSpace(s)
	var l, h int
	switch {
	case s == "":
		return 0, 0, errors.New("empty")
	case strings.Count(s, "-")+strings.Count(s, "+") > 1:
		return 0, 0, errors.New(`want "lo-hi" or "lo+n"`)
	case strings.Contains(s, "-"):
		a, b, _ := strings.Cut(s, "-")
		l, err = atoiPort(a)
		if err == nil {
			h, err = atoiPort(b)
		}
	case strings.Contains(s, "+"):
		a, b, _ := strings.Cut(s, "+")
		var n int
		l, err = atoiPort(a)
		if err == nil {
			n, err = strconv.Atoi(strings.TrimSpace(b))
			if err != nil || n < 0 {
				err = fmt.Errorf("bad size %q", b)
			}
			h = l + n
		}
	default:
		l, err = atoiPort(s)
		h = l
	}
	if err != nil {
		return 0, 0, err
	}
	if l < 1 || h > 65535 {
		return 0, 0, errors.New("ports must be within 1-65535")
	}
	if h < l {
		return 0, 0, errors.New("end port is below start port")
	}
	return uint16(l), uint16(h), nil
}

func atoiPort(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("bad port %q", s)
	}
	return n, nil
}

// parseHostPort parses "ip:port" with a literal IP (IPv6 in brackets) and
// a port within 1-65535.
func parseHostPort(s string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, errors.New("want IP:port")
	}
	a, err := model.ParseAddr(host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bad IP %q", host)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return netip.AddrPort{}, fmt.Errorf("bad port %q (want 1-65535)", port)
	}
	return netip.AddrPortFrom(a, uint16(p)), nil
}

// parseRegistry parses "" (bbolt in the state dir, nil endpoints) or
// "etcd://host:port[,host:port…]" into "http://host:port" endpoints.
func parseRegistry(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	rest, ok := strings.CutPrefix(s, "etcd://")
	if !ok {
		return nil, errors.New(`want "" (bbolt file in --state-dir) or "etcd://host:port[,host:port]"`)
	}
	var eps []string
	for _, hp := range strings.Split(rest, ",") {
		host, port, err := net.SplitHostPort(strings.TrimSpace(hp))
		if err != nil || host == "" || strings.ContainsAny(host, "/?#@ ") {
			return nil, fmt.Errorf("endpoint %q: want host:port", hp)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("endpoint %q: bad port", hp)
		}
		eps = append(eps, "http://"+net.JoinHostPort(host, port))
	}
	return eps, nil
}
