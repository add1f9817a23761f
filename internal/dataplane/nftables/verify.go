package nftables

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane"
)

// Counts is what a table holds, counted: rules per chain and elements per
// set or map. Sets is every set and map of the table; Elems leaves out
// interval sets, whose kernel elements are not one per element written.
type Counts struct {
	Rules map[string]int
	Elems map[string]int
	Sets  map[string]bool
}

// Counter is a Transport that can count a table's rules and elements
// without decoding them: the cheap drift check of Proxier.Verify.
type Counter interface {
	Count(ctx context.Context, family knftables.Family, table string) (Counts, error)
}

// Verify implements dataplane.Verifier. It compares, per family, the rule
// count of every regular chain and the element count of every static map
// and set the last sync wrote with what the kernel holds (netlink dumps
// of the table's rules and sets and of each set's elements; no rule or
// element is decoded), and returns an error wrapping dataplane.ErrDrift
// naming the first few differences. Affinity sets are not compared (the
// kernel fills them). The dumps run without the proxier's lock, so Syncs
// are not held up; a count that overlapped a Sync is discarded (nil: the
// next Verify decides). With a transport that cannot count, or before the
// first sync, it reports no drift.
func (p *Proxier) Verify(ctx context.Context) error {
	c, ok := p.tr.(Counter)
	if !ok {
		return nil
	}
	type want struct {
		rules map[string]int
		elems map[string]int
	}
	p.mu.Lock()
	if p.applied == nil {
		p.mu.Unlock()
		return nil
	}
	syncs := p.syncs
	wants := map[knftables.Family]want{}
	for _, f := range families {
		rs := p.applied[f]
		if rs == nil {
			continue
		}
		w := want{rules: make(map[string]int, len(rs.chains)), elems: make(map[string]int, len(rs.elems))}
		for name, rules := range rs.chains {
			w.rules[name] = len(rules)
		}
		for name, el := range rs.elems {
			w.elems[name] = len(el)
		}
		wants[f] = w
	}
	p.mu.Unlock()

	var diffs []string
	for _, f := range families {
		w, ok := wants[f]
		if !ok {
			continue
		}
		got, err := c.Count(ctx, f, TableName)
		if err != nil {
			return fmt.Errorf("nftables: verify: %w", err)
		}
		for name, n := range w.rules {
			if got.Rules[name] != n {
				diffs = append(diffs, fmt.Sprintf("%s chain %s: %d rules, want %d", f, name, got.Rules[name], n))
			}
		}
		for name, n := range w.elems {
			if !got.Sets[name] {
				diffs = append(diffs, fmt.Sprintf("%s set %s: missing", f, name))
				continue
			}
			if k, counted := got.Elems[name]; counted && k != n {
				diffs = append(diffs, fmt.Sprintf("%s set %s: %d elements, want %d", f, name, k, n))
			}
		}
	}
	p.mu.Lock()
	overlapped := p.syncs != syncs
	p.mu.Unlock()
	if len(diffs) == 0 || overlapped {
		return nil
	}
	slices.Sort(diffs)
	if len(diffs) > 5 {
		diffs = append(diffs[:5], fmt.Sprintf("and %d more", len(diffs)-5))
	}
	return fmt.Errorf("%w: %s", dataplane.ErrDrift, strings.Join(diffs, "; "))
}

var _ dataplane.Verifier = (*Proxier)(nil)

// Count implements Counter from the fake's tables.
func (f *FakeTransport) Count(_ context.Context, family knftables.Family, table string) (Counts, error) {
	f.Fake.RLock()
	defer f.Fake.RUnlock()
	c := Counts{Rules: map[string]int{}, Elems: map[string]int{}, Sets: map[string]bool{}}
	t := f.Fake.Tables[family][table]
	if t == nil {
		return c, nil
	}
	for name, ch := range t.Chains {
		c.Rules[name] = len(ch.Rules)
	}
	for name, s := range t.Sets {
		c.Sets[name], c.Elems[name] = true, len(s.Elements)
	}
	for name, m := range t.Maps {
		c.Sets[name], c.Elems[name] = true, len(m.Elements)
	}
	return c, nil
}

// Count implements Counter over netlink: one dump of the table's rules,
// one of its sets, and one of each set's elements, reading only the
// attributes that name a rule's chain and list a set's elements.
func (n *NFT) Count(_ context.Context, family knftables.Family, table string) (Counts, error) {
	fam, ok := gnftFamilies[family]
	if !ok {
		return Counts{}, fmt.Errorf("nft count: unsupported family %q", family)
	}
	// 32 KiB receives: the kernel sizes each dump batch by the largest
	// receive so far (at most 32 KiB), and resumes a set element dump by
	// skipping what it already sent, so small batches make a dump of a
	// 100,000-element map quadratic.
	cfg := &netlink.Config{MessageBufferSize: 32 << 10}
	if n.Netns != "" {
		f, err := os.Open("/run/netns/" + n.Netns)
		if err != nil {
			return Counts{}, fmt.Errorf("nft count: %w", err)
		}
		defer f.Close()
		cfg.NetNS = int(f.Fd())
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return Counts{}, fmt.Errorf("nft count: %w", err)
	}
	defer conn.Close()
	c := Counts{Rules: map[string]int{}, Elems: map[string]int{}, Sets: map[string]bool{}}
	tableAttr := func(typ uint16) []byte {
		ae := netlink.NewAttributeEncoder()
		ae.String(typ, table)
		b, _ := ae.Encode()
		return b
	}
	dump := func(msgType uint16, attrs []byte) ([]netlink.Message, error) {
		msgs, err := conn.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msgType), Flags: netlink.Request | netlink.Dump},
			Data:   append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, attrs...),
		})
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return msgs, err
	}
	rules, err := dump(unix.NFT_MSG_GETRULE, tableAttr(unix.NFTA_RULE_TABLE))
	if err != nil {
		return Counts{}, fmt.Errorf("nft count: rules of %s %s: %w", family, table, err)
	}
	for _, m := range rules {
		if chain, ok := attrString(m.Data, unix.NFTA_RULE_CHAIN); ok {
			c.Rules[chain]++
		}
	}
	sets, err := dump(unix.NFT_MSG_GETSET, tableAttr(unix.NFTA_SET_TABLE))
	if err != nil {
		return Counts{}, fmt.Errorf("nft count: sets of %s %s: %w", family, table, err)
	}
	for _, m := range sets {
		if t, _ := attrString(m.Data, unix.NFTA_SET_TABLE); t != table {
			continue // the kernel filters by table; older ones may not
		}
		name, ok := attrString(m.Data, unix.NFTA_SET_NAME)
		if !ok {
			continue
		}
		c.Sets[name] = true
		if flags, ok := attrBytes(m.Data, unix.NFTA_SET_FLAGS); ok && len(flags) == 4 && binary.BigEndian.Uint32(flags)&unix.NFT_SET_INTERVAL != 0 {
			continue
		}
		ae := netlink.NewAttributeEncoder()
		ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
		ae.String(unix.NFTA_SET_ELEM_LIST_SET, name)
		b, _ := ae.Encode()
		elems, err := dump(unix.NFT_MSG_GETSETELEM, b)
		if err != nil {
			return Counts{}, fmt.Errorf("nft count: elements of %s %s %s: %w", family, table, name, err)
		}
		total := 0
		for _, em := range elems {
			if list, ok := attrBytes(em.Data, unix.NFTA_SET_ELEM_LIST_ELEMENTS); ok {
				ad, err := netlink.NewAttributeDecoder(list)
				if err != nil {
					return Counts{}, fmt.Errorf("nft count: elements of %s: %w", name, err)
				}
				for ad.Next() {
					total++
				}
			}
		}
		c.Elems[name] = total
	}
	return c, nil
}

// attrBytes returns the value of the first attribute of type typ after a
// nfgenmsg header.
func attrBytes(data []byte, typ uint16) ([]byte, bool) {
	if len(data) < 4 {
		return nil, false
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return nil, false
	}
	for ad.Next() {
		if ad.Type() == typ {
			return ad.Bytes(), true
		}
	}
	return nil, false
}

func attrString(data []byte, typ uint16) (string, bool) {
	b, ok := attrBytes(data, typ)
	if !ok {
		return "", false
	}
	return strings.TrimRight(string(b), "\x00"), true
}
