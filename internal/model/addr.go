package model

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// ErrBadAddress is wrapped by every ParseAddr and ParsePrefix failure.
var ErrBadAddress = errors.New("invalid IP address")

// ErrLeadingZero is wrapped (together with ErrBadAddress) by
// ParseAddrStrict and ParsePrefixStrict when an IPv4 octet has a leading
// zero: "010.096.000.060" reads as 10.96.0.60 to kube-proxy and the API
// server's old validation but as 8.78.0.48 to inet_aton and many
// firewalls, the ambiguity behind CVE-2021-29923.
var ErrLeadingZero = errors.New("leading zero in an IPv4 octet is ambiguous (octal or decimal, CVE-2021-29923)")

// HasLeadingZero reports whether s, an IPv4 address or CIDR as ParseAddr
// or ParsePrefix accepts it, has an octet with a superfluous leading zero
// ("010.1.2.3", "10.01.2.3/8"). IPv6 text (with a colon) never has one in
// this sense.
func HasLeadingZero(s string) bool {
	if strings.Contains(s, ":") {
		return false
	}
	if i := strings.IndexByte(s, '/'); i >= 0 {
		s = s[:i]
	}
	for len(s) > 0 {
		octet, rest, _ := strings.Cut(s, ".")
		if len(octet) > 1 && octet[0] == '0' {
			return true
		}
		s = rest
	}
	return false
}

// ParseAddrStrict is ParseAddr that also refuses leading zeros in IPv4
// octets (ErrLeadingZero), as the API server's strict IP validation does.
// Standalone mode, where vipproxy is the validator, parses with it.
func ParseAddrStrict(s string) (netip.Addr, error) {
	a, err := ParseAddr(s)
	if err == nil && HasLeadingZero(s) {
		return netip.Addr{}, fmt.Errorf("%w %q: %w; write %s", ErrBadAddress, s, ErrLeadingZero, a)
	}
	return a, err
}

// ParsePrefixStrict is ParsePrefix that also refuses leading zeros in
// IPv4 octets (ErrLeadingZero).
func ParsePrefixStrict(s string) (netip.Prefix, error) {
	p, err := ParsePrefix(s)
	if err == nil && HasLeadingZero(s) {
		return netip.Prefix{}, fmt.Errorf("%w %q: %w; write %s", ErrBadAddress, s, ErrLeadingZero, p)
	}
	return p, err
}

// ParseAddr parses an IP address the way Kubernetes accepts it and returns
// it in canonical form, so that two spellings of one address compare equal:
//
//   - IPv4 octets may carry leading zeros, which are read as DECIMAL, not
//     octal: "010.096.000.010" is 10.96.0.10. This is what kube-proxy's
//     ParseIPSloppy does for objects stored before the API refused them.
//     Like ParseIPSloppy, an octet may have any number of digits
//     ("0010" is 10) as long as its value is at most 255.
//   - IPv6 is accepted in any letter case; the result prints lower-case and
//     compressed ("2001:DB8:0::1" → 2001:db8::1).
//   - An IPv4-mapped IPv6 address ("::ffff:1.2.3.4") is returned as the
//     plain IPv4 address 1.2.3.4, as net.ParseIP and kube-proxy treat it.
//     Programming it as IPv6 would yield rules that never match, because
//     the kernel sees such traffic as IPv4.
//   - Zones ("fe80::1%eth0"), surrounding spaces and empty strings are
//     refused.
//
// Errors wrap ErrBadAddress and quote the input.
func ParseAddr(s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, fmt.Errorf("%w: empty string", ErrBadAddress)
	}
	if strings.Contains(s, "%") {
		return netip.Addr{}, fmt.Errorf("%w %q: zones are not allowed", ErrBadAddress, s)
	}
	if !strings.Contains(s, ":") {
		a, ok := parseIPv4Decimal(s)
		if !ok {
			return netip.Addr{}, fmt.Errorf("%w %q", ErrBadAddress, s)
		}
		return a, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w %q", ErrBadAddress, s)
	}
	return a.Unmap(), nil
}

// parseIPv4Decimal parses four dot-separated decimal octets, leading zeros
// allowed and read as decimal.
func parseIPv4Decimal(s string) (netip.Addr, bool) {
	var b [4]byte
	i := 0
	for n := 0; n < 4; n++ {
		if n > 0 {
			if i >= len(s) || s[i] != '.' {
				return netip.Addr{}, false
			}
			i++
		}
		v, digits := 0, 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			v = v*10 + int(s[i]-'0')
			digits++
			i++
			if v > 255 {
				return netip.Addr{}, false
			}
		}
		if digits == 0 || v > 255 {
			return netip.Addr{}, false
		}
		b[n] = byte(v)
	}
	if i != len(s) {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4(b), true
}

// ParsePrefix parses a CIDR the way Kubernetes' ParseCIDRSloppy does and
// returns the network it denotes:
//
//   - the address part follows ParseAddr (decimal leading zeros, any case,
//     no zone);
//   - host bits are masked off ("10.0.0.5/8" → 10.0.0.0/8), as the IPNet
//     that ParseCIDRSloppy returns is masked and that is what kube-proxy
//     programs (for loadBalancerSourceRanges, cluster CIDRs, …);
//   - an IPv4-mapped prefix ("::ffff:10.0.0.0/104") becomes the IPv4 prefix
//     10.0.0.0/8; its length must then be at least 96.
//
// Errors wrap ErrBadAddress and quote the input.
func ParsePrefix(s string) (netip.Prefix, error) {
	addr, bitsStr, ok := strings.Cut(s, "/")
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%w %q: missing /length", ErrBadAddress, s)
	}
	bits, ok := parseDecimal(bitsStr, 3)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%w %q: bad prefix length", ErrBadAddress, s)
	}
	if strings.Contains(addr, "%") {
		return netip.Prefix{}, fmt.Errorf("%w %q: zones are not allowed", ErrBadAddress, s)
	}
	var a netip.Addr
	if strings.Contains(addr, ":") {
		raw, err := netip.ParseAddr(addr)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%w %q", ErrBadAddress, s)
		}
		if bits > 128 {
			return netip.Prefix{}, fmt.Errorf("%w %q: prefix length %d > 128", ErrBadAddress, s, bits)
		}
		a = raw
		if raw.Is4In6() {
			if bits < 96 {
				return netip.Prefix{}, fmt.Errorf("%w %q: IPv4-mapped prefix shorter than /96", ErrBadAddress, s)
			}
			a, bits = raw.Unmap(), bits-96
		}
	} else {
		v4, ok := parseIPv4Decimal(addr)
		if !ok {
			return netip.Prefix{}, fmt.Errorf("%w %q", ErrBadAddress, s)
		}
		if bits > 32 {
			return netip.Prefix{}, fmt.Errorf("%w %q: prefix length %d > 32", ErrBadAddress, s, bits)
		}
		a = v4
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%w %q: %v", ErrBadAddress, s, err)
	}
	return p, nil
}

// parseDecimal parses 1..maxDigits decimal digits.
func parseDecimal(s string, maxDigits int) (int, bool) {
	if s == "" || len(s) > maxDigits {
		return 0, false
	}
	v := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		v = v*10 + int(s[i]-'0')
	}
	return v, true
}
