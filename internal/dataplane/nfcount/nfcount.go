//go:build linux

// Package nfcount counts what an nf_tables table holds — rules per chain,
// elements per set or map — over netlink dumps that decode nothing but the
// attributes naming a rule's chain and listing a set's elements. It is the
// cheap half of a drift check: nftables mode counts its own table, and
// iptables mode counts the nf_tables tables iptables-nft keeps its rules
// in, where iptables-save would render every rule as text. Elements lists
// a set's elements as raw bytes, for nftables mode to adopt its table at
// a restart.
package nfcount

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Family is an nf_tables family number (unix.NFPROTO_IPV4, …).
type Family uint8

// Families by the names nft uses.
const (
	IPv4 Family = unix.NFPROTO_IPV4
	IPv6 Family = unix.NFPROTO_IPV6
	Inet Family = unix.NFPROTO_INET
)

// Counts is what one table holds. Sets lists every set and map; Elems
// leaves out interval sets, whose kernel elements are not one per element
// written.
type Counts struct {
	Rules map[string]int
	Elems map[string]int
	Sets  map[string]bool
}

// Options say where to count.
type Options struct {
	// Netns, when set, names a network namespace (/run/netns/<Netns>);
	// empty means the caller's.
	Netns string
	// Elements also counts every set's elements (one dump per set), or,
	// when ElementsOf is set, the elements of the sets it accepts.
	Elements   bool
	ElementsOf func(set string) bool
}

// Table counts table of family fam. A missing table counts as empty.
func Table(fam Family, table string, o Options) (Counts, error) {
	// 32 KiB receives (see dial): the kernel sizes each dump batch by the
	// largest receive so far (at most 32 KiB), and resumes a set element
	// dump by skipping what it already sent, so small batches make a dump
	// of a 100,000-element map quadratic (2.2 s against 0.34 s).
	conn, err := dial(o)
	if err != nil {
		return Counts{}, err
	}
	defer conn.Close()
	c := Counts{Rules: map[string]int{}, Elems: map[string]int{}, Sets: map[string]bool{}}
	dump := func(msgType uint16, attrs func(ae *netlink.AttributeEncoder)) ([]netlink.Message, error) {
		return dump(conn, fam, msgType, attrs)
	}
	rules, err := dump(unix.NFT_MSG_GETRULE, func(ae *netlink.AttributeEncoder) { ae.String(unix.NFTA_RULE_TABLE, table) })
	if err != nil {
		return Counts{}, fmt.Errorf("nfcount: rules of %s: %w", table, err)
	}
	for _, m := range rules {
		if t, _ := attrString(m.Data, unix.NFTA_RULE_TABLE); t != table {
			continue // the kernel filters by table; be sure
		}
		if chain, ok := attrString(m.Data, unix.NFTA_RULE_CHAIN); ok {
			c.Rules[chain]++
		}
	}
	sets, err := dump(unix.NFT_MSG_GETSET, func(ae *netlink.AttributeEncoder) { ae.String(unix.NFTA_SET_TABLE, table) })
	if err != nil {
		return Counts{}, fmt.Errorf("nfcount: sets of %s: %w", table, err)
	}
	for _, m := range sets {
		if t, _ := attrString(m.Data, unix.NFTA_SET_TABLE); t != table {
			continue
		}
		name, ok := attrString(m.Data, unix.NFTA_SET_NAME)
		if !ok {
			continue
		}
		c.Sets[name] = true
		if !o.Elements || (o.ElementsOf != nil && !o.ElementsOf(name)) {
			continue
		}
		if flags, ok := attrBytes(m.Data, unix.NFTA_SET_FLAGS); ok && len(flags) == 4 && binary.BigEndian.Uint32(flags)&unix.NFT_SET_INTERVAL != 0 {
			continue
		}
		elems, err := dump(unix.NFT_MSG_GETSETELEM, func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
			ae.String(unix.NFTA_SET_ELEM_LIST_SET, name)
		})
		if err != nil {
			return Counts{}, fmt.Errorf("nfcount: elements of %s %s: %w", table, name, err)
		}
		if c.Elems[name], err = countElems(elems); err != nil {
			return Counts{}, fmt.Errorf("nfcount: elements of %s: %w", name, err)
		}
	}
	return c, nil
}

// dump runs one netlink dump request of msgType for family fam; a missing
// object (ENOENT) dumps nothing.
func dump(conn *netlink.Conn, fam Family, msgType uint16, attrs func(ae *netlink.AttributeEncoder)) ([]netlink.Message, error) {
	ae := netlink.NewAttributeEncoder()
	attrs(ae)
	b, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msgType), Flags: netlink.Request | netlink.Dump},
		Data:   append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, b...),
	})
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	return msgs, err
}

// Element is one element of a set or map as the kernel lists it: Key is
// its key's bytes (NFTA_DATA_VALUE), Value its data's, for a map: the
// value's bytes, or for a verdict map (Verdict true) the attributes of
// NFTA_DATA_VERDICT (code, chain). Both are views into the dump, valid
// during the callback only.
type Element struct {
	Key, Value []byte
	Verdict    bool
}

// Elements dumps the elements of set (or map) in table of family fam and
// calls fn with each, in the kernel's order, stopping at fn's first error.
// The dump uses the large receives Table does (a 100,000-element map in
// a fraction of a second, where small receives make it quadratic). A
// missing set has no elements.
func Elements(fam Family, table, set string, o Options, fn func(Element) error) error {
	conn, err := dial(o)
	if err != nil {
		return err
	}
	defer conn.Close()
	msgs, err := dump(conn, fam, unix.NFT_MSG_GETSETELEM, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
		ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	})
	if err != nil {
		return fmt.Errorf("nfcount: elements of %s %s: %w", table, set, err)
	}
	for _, m := range msgs {
		list, ok := attrBytes(m.Data, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		if !ok {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(list)
		if err != nil {
			return fmt.Errorf("nfcount: elements of %s %s: %w", table, set, err)
		}
		for ad.Next() {
			e, err := element(ad.Bytes())
			if err == nil {
				err = fn(e)
			}
			if err != nil {
				return fmt.Errorf("nfcount: elements of %s %s: %w", table, set, err)
			}
		}
		if err := ad.Err(); err != nil {
			return fmt.Errorf("nfcount: elements of %s %s: %w", table, set, err)
		}
	}
	return nil
}

// element reads one NFTA_LIST_ELEM's key and data.
func element(b []byte) (Element, error) {
	var e Element
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return e, err
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_ELEM_KEY, unix.NFTA_SET_ELEM_DATA:
			inner, err := netlink.NewAttributeDecoder(ad.Bytes())
			if err != nil {
				return e, err
			}
			for inner.Next() {
				switch {
				case ad.Type() == unix.NFTA_SET_ELEM_KEY && inner.Type() == unix.NFTA_DATA_VALUE:
					e.Key = inner.Bytes()
				case ad.Type() == unix.NFTA_SET_ELEM_DATA && inner.Type() == unix.NFTA_DATA_VALUE:
					e.Value = inner.Bytes()
				case ad.Type() == unix.NFTA_SET_ELEM_DATA && inner.Type() == unix.NFTA_DATA_VERDICT:
					e.Value, e.Verdict = inner.Bytes(), true
				}
			}
			if err := inner.Err(); err != nil {
				return e, err
			}
		}
	}
	return e, ad.Err()
}

// countElems counts the elements in a set element dump.
func countElems(msgs []netlink.Message) (int, error) {
	total := 0
	for _, em := range msgs {
		if list, ok := attrBytes(em.Data, unix.NFTA_SET_ELEM_LIST_ELEMENTS); ok {
			ad, err := netlink.NewAttributeDecoder(list)
			if err != nil {
				return 0, err
			}
			for ad.Next() {
				total++
			}
		}
	}
	return total, nil
}

// Chains counts the rules of each of chains in table of family fam, one
// dump per chain: the kernel looks a named chain up directly, so this
// costs O(rules of those chains), where a dump of the whole table is
// resumed by skipping and grows quadratically with its rules (a table of
// 110,000 iptables-nft rules: 20 s). A missing chain counts -1.
func Chains(fam Family, table string, chains []string, o Options) (map[string]int, error) {
	conn, err := dial(o)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	out := make(map[string]int, len(chains))
	for _, chain := range chains {
		ae := netlink.NewAttributeEncoder()
		ae.String(unix.NFTA_RULE_TABLE, table)
		ae.String(unix.NFTA_RULE_CHAIN, chain)
		b, err := ae.Encode()
		if err != nil {
			return nil, err
		}
		msgs, err := conn.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE), Flags: netlink.Request | netlink.Dump},
			Data:   append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, b...),
		})
		switch {
		case errors.Is(err, unix.ENOENT):
			out[chain] = -1
		case err != nil:
			return nil, fmt.Errorf("nfcount: rules of %s %s: %w", table, chain, err)
		default:
			out[chain] = len(msgs)
		}
	}
	return out, nil
}

// dial opens a netfilter netlink socket in o.Netns.
func dial(o Options) (*netlink.Conn, error) {
	cfg := &netlink.Config{MessageBufferSize: 32 << 10}
	if o.Netns != "" {
		f, err := os.Open("/run/netns/" + o.Netns)
		if err != nil {
			return nil, fmt.Errorf("nfcount: %w", err)
		}
		defer f.Close()
		cfg.NetNS = int(f.Fd())
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, fmt.Errorf("nfcount: %w", err)
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
