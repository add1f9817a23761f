package convert

import (
	"fmt"
	"net/netip"

	"github.com/vipproxy/vipproxy/internal/model"
)

// parseAddr and parsePrefix parse addresses canonically (leading-zero IPv4
// octets read as decimal, IPv6 lower-cased, IPv4-mapped unmapped): every
// address that reaches the model goes through model's one parser.
func parseAddr(s string) (netip.Addr, error) { return model.ParseAddr(s) }

func parsePrefix(s string) (netip.Prefix, error) { return model.ParsePrefix(s) }

// addr parses the address s of field. Strict (standalone) conversion
// refuses leading-zero IPv4 octets with an error wrapping
// model.ErrLeadingZero; lenient (Kubernetes) conversion reads them as
// decimal, as kube-proxy does for objects stored before the API server
// refused them, and records a warning Problem naming the object.
func (p *problems) addr(field func() string, s string) (netip.Addr, error) {
	if p.strict {
		return model.ParseAddrStrict(s)
	}
	a, err := parseAddr(s)
	if err == nil && model.HasLeadingZero(s) {
		p.leadingZero(field(), s, a.String())
	}
	return a, err
}

// prefix is addr for a CIDR.
func (p *problems) prefix(field, s string) (netip.Prefix, error) {
	if p.strict {
		return model.ParsePrefixStrict(s)
	}
	pfx, err := parsePrefix(s)
	if err == nil && model.HasLeadingZero(s) {
		p.leadingZero(field, s, pfx.String())
	}
	return pfx, err
}

func (p *problems) leadingZero(field, s, read string) {
	p.add(field, s, fmt.Sprintf("warning: %v; read as decimal %s, as kube-proxy does (the API server refuses this spelling today)", model.ErrLeadingZero, read))
}
