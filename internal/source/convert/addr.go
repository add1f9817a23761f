package convert

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
)

// parseAddr parses an IP address the way the Kubernetes API does:
// IPv4 octets with leading zeros are read as decimal ("010.096.000.010"
// is 10.96.0.10), IPv6 is accepted in any case, and IPv4-mapped IPv6
// addresses become plain IPv4. The result is canonical. Zones and
// surrounding space are refused.
func parseAddr(s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, errors.New("empty address")
	}
	if strings.Contains(s, ":") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Addr{}, errors.New("not an IP address")
		}
		if a.Zone() != "" {
			return netip.Addr{}, errors.New("IPv6 zone not allowed")
		}
		return a.Unmap(), nil
	}
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, errors.New("not an IP address")
	}
	var b [4]byte
	for i, p := range parts {
		if p == "" || len(p) > 10 {
			return netip.Addr{}, errors.New("not an IP address")
		}
		for _, c := range p {
			if c < '0' || c > '9' {
				return netip.Addr{}, errors.New("not an IP address")
			}
		}
		n, err := strconv.Atoi(p)
		if err != nil || n > 255 {
			return netip.Addr{}, errors.New("IPv4 octet out of range")
		}
		b[i] = byte(n)
	}
	return netip.AddrFrom4(b), nil
}

// parsePrefix parses a CIDR with parseAddr's rules for the address part and
// returns the masked network ("10.0.0.1/8" is 10.0.0.0/8).
func parsePrefix(s string) (netip.Prefix, error) {
	addr, bits, ok := strings.Cut(s, "/")
	if !ok {
		return netip.Prefix{}, errors.New("not a CIDR (missing /bits)")
	}
	if strings.Contains(addr, ":") {
		if a, err := netip.ParseAddr(addr); err == nil && a.Is4In6() {
			return netip.Prefix{}, errors.New("IPv4-mapped IPv6 CIDR not allowed")
		}
	}
	a, err := parseAddr(addr)
	if err != nil {
		return netip.Prefix{}, err
	}
	if bits == "" || len(bits) > 3 {
		return netip.Prefix{}, errors.New("bad prefix length")
	}
	for _, c := range bits {
		if c < '0' || c > '9' {
			return netip.Prefix{}, errors.New("bad prefix length")
		}
	}
	n, _ := strconv.Atoi(bits)
	if n > a.BitLen() {
		return netip.Prefix{}, errors.New("prefix length out of range")
	}
	return netip.PrefixFrom(a, n).Masked(), nil
}
