package nftables

// Reading a client's ClientIP affinity entry back from the kernel (for
// explain): the per-endpoint timeout sets that pick's sticky chains update.

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	gnft "github.com/google/nftables"
	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/model"
)

// TimedElement is a set element's key (raw bytes) and the time left
// before it expires.
type TimedElement struct {
	Key     []byte
	Expires time.Duration
}

// ElementLister is implemented by Transports that can list a set's
// elements with their expiry (NFT, over netlink).
type ElementLister interface {
	ListTimed(ctx context.Context, family knftables.Family, table, set string) ([]TimedElement, error)
}

// ListTimed implements ElementLister over netlink. A missing set lists
// nothing.
func (n *NFT) ListTimed(_ context.Context, family knftables.Family, table, set string) ([]TimedElement, error) {
	fam, ok := gnftFamilies[family]
	if !ok {
		return nil, fmt.Errorf("nft: unsupported family %q", family)
	}
	conn, closeNS, err := n.conn()
	if err != nil {
		return nil, fmt.Errorf("nft: %w", err)
	}
	defer closeNS()
	t := &gnft.Table{Name: table, Family: fam}
	s, err := conn.GetSetByName(t, set)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("nft: set %s %s %s: %w", family, table, set, err)
	}
	els, err := conn.GetSetElements(s)
	if err != nil {
		return nil, fmt.Errorf("nft: elements of %s %s %s: %w", family, table, set, err)
	}
	out := make([]TimedElement, len(els))
	for i, e := range els {
		out[i] = TimedElement{Key: e.Key, Expires: e.Expires}
	}
	return out, nil
}

// Affinity implements dataplane.AffinityReader: the affinity set of each
// of sp's endpoints (in client's family) is looked up for client.
func (p *Proxier) Affinity(ctx context.Context, sp *model.ServicePort, client netip.Addr) (dataplane.AffinityEntry, bool, error) {
	if sp.AffinityTimeoutSeconds <= 0 {
		return dataplane.AffinityEntry{}, false, nil
	}
	l, ok := p.tr.(ElementLister)
	if !ok {
		return dataplane.AffinityEntry{}, false, fmt.Errorf("nftables: the transport cannot list set elements")
	}
	client = client.Unmap()
	fam := knftables.IPv4Family
	if client.Is6() {
		fam = knftables.IPv6Family
	}
	id := portID(sp.Name)
	for _, e := range dataplane.AffinityEndpoints(sp, client) {
		els, err := l.ListTimed(ctx, fam, TableName, affinitySetName(id, e, sp.AffinityTimeoutSeconds))
		if err != nil {
			return dataplane.AffinityEntry{}, false, err
		}
		for _, el := range els {
			if a, ok := netip.AddrFromSlice(el.Key); ok && a.Unmap() == client {
				return dataplane.AffinityEntry{Endpoint: netip.AddrPortFrom(e.IP.Unmap(), e.Port), Expires: el.Expires}, true, nil
			}
		}
	}
	return dataplane.AffinityEntry{}, false, nil
}
