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
	"sync"

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
	// 32 KiB receives (see recvSize): the kernel sizes each dump batch by
	// the largest receive so far (at most 32 KiB), and resumes a set
	// element dump by skipping what it already sent, so small batches make
	// a dump of a 100,000-element map quadratic (2.2 s against 0.34 s).
	conn, err := dial(o)
	if err != nil {
		return Counts{}, err
	}
	defer conn.Close()
	c := Counts{Rules: map[string]int{}, Elems: map[string]int{}, Sets: map[string]bool{}}
	err = each(conn, fam, unix.NFT_MSG_GETRULE, func(ae *netlink.AttributeEncoder) { ae.String(unix.NFTA_RULE_TABLE, table) }, func(data []byte) error {
		if t, _ := attrBytes(data, unix.NFTA_RULE_TABLE); string(cString(t)) != table {
			return nil // the kernel filters by table; be sure
		}
		if chain, ok := attrBytes(data, unix.NFTA_RULE_CHAIN); ok {
			c.Rules[string(cString(chain))]++
		}
		return nil
	})
	if empty(err) != nil {
		return Counts{}, fmt.Errorf("nfcount: rules of %s: %w", table, err)
	}
	var counted []string // the sets whose elements to count, after the set dump
	err = each(conn, fam, unix.NFT_MSG_GETSET, func(ae *netlink.AttributeEncoder) { ae.String(unix.NFTA_SET_TABLE, table) }, func(data []byte) error {
		if t, _ := attrBytes(data, unix.NFTA_SET_TABLE); string(cString(t)) != table {
			return nil
		}
		name, ok := attrString(data, unix.NFTA_SET_NAME)
		if !ok {
			return nil
		}
		c.Sets[name] = true
		if !o.Elements || (o.ElementsOf != nil && !o.ElementsOf(name)) {
			return nil
		}
		if flags, ok := attrBytes(data, unix.NFTA_SET_FLAGS); ok && len(flags) == 4 && binary.BigEndian.Uint32(flags)&unix.NFT_SET_INTERVAL != 0 {
			return nil
		}
		counted = append(counted, name)
		return nil
	})
	if empty(err) != nil {
		return Counts{}, fmt.Errorf("nfcount: sets of %s: %w", table, err)
	}
	for _, name := range counted {
		n := 0
		err := each(conn, fam, unix.NFT_MSG_GETSETELEM, func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
			ae.String(unix.NFTA_SET_ELEM_LIST_SET, name)
		}, func(data []byte) error {
			k, err := countElems(data)
			n += k
			return err
		})
		if empty(err) != nil {
			return Counts{}, fmt.Errorf("nfcount: elements of %s %s: %w", table, name, err)
		}
		c.Elems[name] = n
	}
	return c, nil
}

// bufs holds receive buffers (*[]byte) for request, so that the dozens
// of dumps of a drift check share a few.
var bufs = sync.Pool{New: func() any { b := make([]byte, recvSize); return &b }}

// recvSize is the receive buffer of a dump: the kernel fills each dump
// batch up to the largest receive so far, at most 32 KiB (a larger
// message is still read whole: see each).
const recvSize = 32 << 10

// each runs one netlink dump request of msgType for family fam on conn
// and calls fn with each reply's payload (the nfgenmsg header and the
// attributes after the netlink header), in order, stopping at fn's first
// error. The payload is a view into a buffer the next receive reuses:
// valid during the call only. Nothing else is kept, so a dump costs one
// buffer however large it is (a drift check at 50,000 Services had
// allocated 12-33 MB of messages every syncPeriod, an adoption's dump of
// a 500,000-element map about 50 MB). A missing object fails with
// unix.ENOENT (see empty).
func each(conn *netlink.Conn, fam Family, msgType uint16, attrs func(ae *netlink.AttributeEncoder), fn func(data []byte) error) error {
	return request(conn, fam, msgType, netlink.Request|netlink.Dump, attrs, fn)
}

// request sends one request of msgType with flags (a dump, or a get with
// netlink.Acknowledge) and calls fn with each reply's payload as each
// describes, until the dump's end or the acknowledgement.
func request(conn *netlink.Conn, fam Family, msgType uint16, flags netlink.HeaderFlags, attrs func(ae *netlink.AttributeEncoder), fn func(data []byte) error) error {
	ae := netlink.NewAttributeEncoder()
	attrs(ae)
	b, err := ae.Encode()
	if err != nil {
		return err
	}
	req, err := conn.Send(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msgType), Flags: flags},
		Data:   append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, b...),
	})
	if err != nil {
		return err
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	buf := *bp
	recv := func(flags int) (int, error) {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, flags)
			return rerr != unix.EAGAIN
		}); err != nil {
			return 0, err
		}
		return n, rerr
	}
	for {
		n, err := recv(unix.MSG_PEEK | unix.MSG_TRUNC)
		if err != nil {
			return err
		}
		if n > len(buf) {
			buf = make([]byte, n)
			*bp = buf
		}
		if n, err = recv(0); err != nil {
			return err
		}
		for msg := buf[:n]; len(msg) >= unix.NLMSG_HDRLEN; {
			l := int(binary.NativeEndian.Uint32(msg))
			if l < unix.NLMSG_HDRLEN || l > len(msg) {
				return fmt.Errorf("malformed netlink message (length %d of %d)", l, len(msg))
			}
			typ, seq := binary.NativeEndian.Uint16(msg[4:]), binary.NativeEndian.Uint32(msg[8:])
			body := msg[unix.NLMSG_HDRLEN:l]
			msg = msg[min(len(msg), (l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1)):]
			if seq != req.Header.Sequence {
				continue // not this dump's
			}
			switch typ {
			case unix.NLMSG_DONE, unix.NLMSG_ERROR:
				// NLMSG_ERROR carries an errno (0: an acknowledgement);
				// NLMSG_DONE may carry the error that ended a dump.
				if len(body) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(body)); code != 0 {
						return unix.Errno(-code)
					}
				}
				return nil
			case unix.NLMSG_NOOP:
			default:
				if err := fn(body); err != nil {
					return err
				}
			}
		}
	}
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
	err = each(conn, fam, unix.NFT_MSG_GETSETELEM, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
		ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	}, func(data []byte) error {
		list, ok := attrBytes(data, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		if !ok {
			return nil
		}
		var ferr error
		err := eachAttr(list, func(_ uint16, b []byte) bool {
			var e Element
			if e, ferr = element(b); ferr == nil {
				ferr = fn(e)
			}
			return ferr == nil
		})
		if ferr != nil {
			return ferr
		}
		return err
	})
	if empty(err) != nil {
		return fmt.Errorf("nfcount: elements of %s %s: %w", table, set, err)
	}
	return nil
}

// empty is err, or nil for unix.ENOENT: a missing table or set dumps
// nothing.
func empty(err error) error {
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// element reads one NFTA_LIST_ELEM's key and data.
func element(b []byte) (Element, error) {
	var e Element
	var ierr error
	err := eachAttr(b, func(typ uint16, v []byte) bool {
		if typ != unix.NFTA_SET_ELEM_KEY && typ != unix.NFTA_SET_ELEM_DATA {
			return true
		}
		ierr = eachAttr(v, func(inner uint16, w []byte) bool {
			switch {
			case typ == unix.NFTA_SET_ELEM_KEY && inner == unix.NFTA_DATA_VALUE:
				e.Key = w
			case typ == unix.NFTA_SET_ELEM_DATA && inner == unix.NFTA_DATA_VALUE:
				e.Value = w
			case typ == unix.NFTA_SET_ELEM_DATA && inner == unix.NFTA_DATA_VERDICT:
				e.Value, e.Verdict = w, true
			}
			return true
		})
		return ierr == nil
	})
	if ierr != nil {
		return e, ierr
	}
	return e, err
}

// countElems counts the elements in one message of a set element dump.
func countElems(data []byte) (int, error) {
	list, ok := attrBytes(data, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	if !ok {
		return 0, nil
	}
	n := 0
	err := eachAttr(list, func(uint16, []byte) bool { n++; return true })
	return n, err
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
		n := 0
		err = each(conn, fam, unix.NFT_MSG_GETRULE, func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_RULE_TABLE, table)
			ae.String(unix.NFTA_RULE_CHAIN, chain)
		}, func([]byte) error { n++; return nil })
		if err == nil && n == 0 {
			// The kernel dumps a missing chain's rules as none (6.x) or
			// fails with ENOENT: ask for the chain itself.
			err = request(conn, fam, unix.NFT_MSG_GETCHAIN, netlink.Request|netlink.Acknowledge, func(ae *netlink.AttributeEncoder) {
				ae.String(unix.NFTA_CHAIN_TABLE, table)
				ae.String(unix.NFTA_CHAIN_NAME, chain)
			}, func([]byte) error { return nil })
		}
		switch {
		case errors.Is(err, unix.ENOENT):
			out[chain] = -1
		case err != nil:
			return nil, fmt.Errorf("nfcount: rules of %s %s: %w", table, chain, err)
		default:
			out[chain] = n
		}
	}
	return out, nil
}

// dial opens a netfilter netlink socket in o.Netns.
func dial(o Options) (*netlink.Conn, error) {
	cfg := &netlink.Config{} // dumps are read by each, into its own buffer
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
	var out []byte
	found := false
	eachAttr(data[4:], func(t uint16, b []byte) bool {
		if t == typ {
			out, found = b, true
		}
		return !found
	})
	return out, found
}

// nlaTypeMask clears an attribute type's nested and byte-order flags.
const nlaTypeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)

// eachAttr calls fn with the type (flags masked off) and payload of each
// netlink attribute in b, in order, until fn returns false. The payloads
// are views into b: nothing is copied or allocated (a dump of 500,000
// elements has millions of attributes). A malformed attribute ends the
// walk with an error.
func eachAttr(b []byte, fn func(typ uint16, data []byte) bool) error {
	for len(b) >= unix.NLA_HDRLEN {
		l := int(binary.NativeEndian.Uint16(b))
		if l < unix.NLA_HDRLEN || l > len(b) {
			return fmt.Errorf("malformed netlink attribute (length %d of %d)", l, len(b))
		}
		if !fn(binary.NativeEndian.Uint16(b[2:])&nlaTypeMask, b[unix.NLA_HDRLEN:l]) {
			return nil
		}
		b = b[min(len(b), (l+unix.NLA_ALIGNTO-1)&^(unix.NLA_ALIGNTO-1)):]
	}
	return nil
}

func attrString(data []byte, typ uint16) (string, bool) {
	b, ok := attrBytes(data, typ)
	if !ok {
		return "", false
	}
	return strings.TrimRight(string(b), "\x00"), true
}

// cString is b without the NUL that ends a netlink string attribute.
func cString(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}
