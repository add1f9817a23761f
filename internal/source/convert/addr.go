package convert

import (
	"net/netip"

	"github.com/vipproxy/vipproxy/internal/model"
)

// parseAddr and parsePrefix parse addresses canonically (leading-zero IPv4
// octets read as decimal, IPv6 lower-cased, IPv4-mapped unmapped): every
// address that reaches the model goes through model's one parser.
func parseAddr(s string) (netip.Addr, error) { return model.ParseAddr(s) }

func parsePrefix(s string) (netip.Prefix, error) { return model.ParsePrefix(s) }
