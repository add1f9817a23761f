//go:build linux

package iptables

import (
	"context"

	"github.com/vipproxy/vipproxy/internal/dataplane/nfcount"
)

// CountRules implements ruleCounter: with the nf_tables backend it counts
// the rules of chains (-1: missing) over netlink, one dump per chain
// (nfcount.Chains), where iptables-nft-save renders every rule as text
// (603 ms at 1,000 Services, 7 s at 10,000). It reports false for the
// legacy backend.
func (e *Exec) CountRules(ctx context.Context, fam Family, table string, chains []string) (map[string]int, bool, error) {
	if !e.IsNFT(ctx, fam) {
		return nil, false, nil
	}
	nf := nfcount.IPv4
	if fam == IPv6 {
		nf = nfcount.IPv6
	}
	c, err := nfcount.Chains(nf, table, chains, nfcount.Options{Netns: e.netns()})
	if err != nil {
		return nil, true, err
	}
	return c, true, nil
}
