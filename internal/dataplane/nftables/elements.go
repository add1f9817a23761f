package nftables

import (
	"context"
	"encoding/binary"
	"fmt"
	"iter"
	"net/netip"
	"os"
	"strconv"
	"strings"

	gnft "github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// ElementOp is one addition or deletion of an element of a static map or
// set of vipproxy's table (see staticMaps and staticSets), written in nft
// syntax: Key is the fields joined by " . ", Value the map value ("goto
// chain", "drop", or fields joined by " . "), "" for a set. The
// operations the proxier makes itself hold Key, and a Value that is not a
// verdict, in wire form instead (see wire.go): Text returns them in nft
// syntax.
type ElementOp struct {
	Delete bool
	Family knftables.Family
	Set    string
	Key    string
	Value  string
	// wire says Key and a non-verdict Value are in wire form.
	wire bool
}

// Elementer is implemented by transports with a fast path for a
// transaction made only of element operations. RunElements applies ops
// atomically, in order: on error none of them is in force. The proxier
// uses it for partial syncs that change no chain, and to fill the maps of
// a freshly created table before it hooks the table in.
type Elementer interface {
	RunElements(ctx context.Context, ops []ElementOp) error
}

// elementsTx appends ops to tx as knftables elements (the slow path, and
// the reference the fast path is tested against).
func elementsTx(tx *knftables.Transaction, ops []ElementOp) {
	for _, op := range ops {
		op = op.Text()
		e := element(op.Family, op.Set, op.Key, op.Value)
		if op.Delete {
			tx.Delete(e)
		} else {
			tx.Add(e)
		}
	}
}

// field is the type of one field of a concatenated key or value; each is
// padded to a multiple of 4 bytes in the kernel's encoding.
type field uint8

const (
	fieldAddr4 field = iota + 1 // ipv4_addr, network order
	fieldAddr6                  // ipv6_addr, network order
	fieldProto                  // inet_proto: one byte
	fieldPort                   // inet_service: two bytes, network order
	fieldSlot                   // numgen result: 32-bit integer, host order
)

// elemLayout says how a static map's or set's elements are encoded.
type elemLayout struct {
	key, val []field
	verdict  bool // values are verdicts
}

// elemLayouts returns the element layout of every static map and set of
// a family ("ip" or "ip6"); it mirrors the types in staticMaps and
// staticSets (TestElementLayouts checks the two agree).
func elemLayouts(ip string) map[string]elemLayout {
	addr := fieldAddr4
	if ip == "ip6" {
		addr = fieldAddr6
	}
	ipKey := []field{addr, fieldProto, fieldPort}
	npKey := []field{fieldProto, fieldPort}
	m := map[string]elemLayout{
		mapServiceIPs:       {key: ipKey, verdict: true},
		mapServiceNodePorts: {key: npKey, verdict: true},
		mapNoEndpointIPs:    {key: ipKey, verdict: true},
		mapNoEndpointPorts:  {key: npKey, verdict: true},
		mapFirewallIPs:      {key: ipKey, verdict: true},
		setClusterIPs:       {key: []field{addr}},
		setHairpin:          {key: []field{addr, addr}},
	}
	for _, pol := range []string{"cluster", "local"} {
		for _, proto := range []string{"tcp", "udp", "sctp"} {
			m[endpointMap(pol, "endpoints", proto)] = elemLayout{key: []field{addr, fieldPort, fieldSlot}, val: []field{addr, fieldPort}}
			m[endpointMap(pol, "nodeport-endpoints", proto)] = elemLayout{key: []field{fieldPort, fieldSlot}, val: []field{addr, fieldPort}}
		}
	}
	return m
}

var layouts = map[knftables.Family]map[string]elemLayout{
	knftables.IPv4Family: elemLayouts("ip"),
	knftables.IPv6Family: elemLayouts("ip6"),
}

// protoNumber is the IP protocol number of "tcp", "udp" or "sctp", 0
// for anything else.
func protoNumber(s string) byte {
	switch s {
	case "tcp":
		return unix.IPPROTO_TCP
	case "udp":
		return unix.IPPROTO_UDP
	case "sctp":
		return unix.IPPROTO_SCTP
	}
	return 0
}

// appendAddr4 appends the dotted-quad IPv4 address s (canonical: no
// leading zeros) in network order; ok is false for anything else, which
// the caller hands to netip.ParseAddr for its verdict.
func appendAddr4(dst []byte, s string) ([]byte, bool) {
	var a [4]byte
	n, v, digits := 0, 0, 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '.' {
			if digits == 0 || n == 4 || (digits > 1 && s[i-digits] == '0') {
				return dst, false
			}
			a[n], n, v, digits = byte(v), n+1, 0, 0
			continue
		}
		c := s[i] - '0'
		if c > 9 {
			return dst, false
		}
		if v = v*10 + int(c); v > 255 {
			return dst, false
		}
		digits++
	}
	if n != 4 {
		return dst, false
	}
	return append(dst, a[:]...), true
}

// encodeFields appends the kernel encoding of s (fields joined by " . ")
// to dst.
func encodeFields(dst []byte, fields []field, s string) ([]byte, error) {
	for i, f := range fields {
		part := s
		if i < len(fields)-1 {
			// No field has a space: the first one ends it.
			j := strings.IndexByte(s, ' ')
			if j < 0 || !strings.HasPrefix(s[j:], " . ") {
				return nil, fmt.Errorf("%q: want %d fields", s, len(fields))
			}
			part, s = s[:j], s[j+3:]
		} else if strings.Contains(s, " . ") {
			return nil, fmt.Errorf("%q: more than %d fields", s, len(fields))
		}
		switch f {
		case fieldAddr4:
			if out, ok := appendAddr4(dst, part); ok {
				dst = out
				continue
			}
			a, err := netip.ParseAddr(part)
			if err != nil || !a.Is4() {
				return nil, fmt.Errorf("field %d %q: not an IPv4 address", i, part)
			}
			dst = append(dst, a.AsSlice()...)
		case fieldAddr6:
			a, err := netip.ParseAddr(part)
			if err != nil || !a.Is6() || a.Zone() != "" {
				return nil, fmt.Errorf("field %d %q: not an IPv6 address", i, part)
			}
			dst = append(dst, a.AsSlice()...)
		case fieldProto:
			n := protoNumber(part)
			if n == 0 {
				return nil, fmt.Errorf("field %d %q: unknown protocol", i, part)
			}
			dst = append(dst, n, 0, 0, 0)
		case fieldPort:
			n, err := strconv.ParseUint(part, 10, 16)
			if err != nil {
				return nil, fmt.Errorf("field %d %q: not a port: %w", i, part, err)
			}
			dst = binary.BigEndian.AppendUint16(dst, uint16(n))
			dst = append(dst, 0, 0)
		case fieldSlot:
			n, err := strconv.ParseUint(part, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("field %d %q: not a slot: %w", i, part, err)
			}
			dst = binary.NativeEndian.AppendUint32(dst, uint32(n))
		}
	}
	return dst, nil
}

// RunElements implements Elementer: it sends ops as one nfnetlink batch
// (atomic, like `nft -f`), without the nft binary's parsing, which is what
// a full sync of 100,000 elements spends its time on.
func (n *NFT) RunElements(ctx context.Context, ops []ElementOp) error {
	if len(ops) == 0 {
		return nil
	}
	b, err := encodeOps(ops)
	if err != nil {
		return fmt.Errorf("nft netlink: %w", err)
	}
	ec, err := dialElems(n.Netns)
	if err != nil {
		return fmt.Errorf("nft netlink: %w", err)
	}
	defer ec.Close()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("nft netlink: %w", err)
	}
	if err := ec.send(b); err != nil {
		return fmt.Errorf("nft netlink: %w", err)
	}
	return nil
}

// encodeOps encodes ops, in order, into one batch.
func encodeOps(ops []ElementOp) (*elemBatch, error) {
	b := newElemBatch(len(ops))
	for _, op := range ops {
		if err := b.add(op); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// fillChunk is the number of elements per batch when a cold start fills
// its maps in a pipeline.
const fillChunk = 32 << 10

// fill adds the count operations ops yields (to maps of tables that are
// not hooked in, so they need not be atomic) in batches of fillChunk
// elements, encoding the next batch while the kernel inserts the current
// one; before sending the first it waits for ready (the nft transaction
// that creates the maps, run meanwhile). ops is ranged over once, on
// another goroutine, while the kernel works: no slice of every element
// is made (at 50,000 Services 731,000 operations of 80 bytes, 58 MB), and
// the first batch goes out as soon as it is encoded. count only sizes the
// batches. It stops at the first error.
func (n *NFT) fill(ctx context.Context, ops iter.Seq[ElementOp], count int, ready <-chan error) error {
	type encoded struct {
		b   *elemBatch
		err error
	}
	ch := make(chan encoded, 1)
	done, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(ch)
		left := count
		b, in := newElemBatch(min(fillChunk, max(left, 1))), 0
		for op := range ops {
			if err := b.add(op); err != nil {
				ch <- encoded{nil, err}
				return
			}
			if in++; in == fillChunk {
				ch <- encoded{b, nil}
				if done.Err() != nil {
					return
				}
				left -= in
				b, in = newElemBatch(min(fillChunk, max(left, 1))), 0
			}
		}
		if in > 0 {
			ch <- encoded{b, nil}
		}
	}()
	err := <-ready
	var ec *elemConn
	if err == nil {
		if ec, err = dialElems(n.Netns); err == nil {
			defer ec.Close()
		}
	}
	for e := range ch {
		switch {
		case err != nil:
			cancel() // drain: the encoder stops at its next batch
		case e.err != nil:
			err = e.err
		case ctx.Err() != nil:
			err = ctx.Err()
		default:
			err = ec.send(e.b)
		}
	}
	if err != nil {
		return fmt.Errorf("nft netlink: %w", err)
	}
	return nil
}

var protoNames = map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_SCTP: "sctp"}

// decodeVerdict reads NFTA_DATA_VERDICT's attributes: the code and, for
// goto and jump, the chain.
func decodeVerdict(b []byte) (string, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return "", err
	}
	ad.ByteOrder = binary.BigEndian
	var code int32
	var chain string
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			code = int32(ad.Uint32())
		case unix.NFTA_VERDICT_CHAIN:
			chain = ad.String()
		}
	}
	if err := ad.Err(); err != nil {
		return "", err
	}
	const nfDrop, nfAccept = 0, 1 // linux/netfilter.h
	switch code {
	case nfDrop:
		return "drop", nil
	case nfAccept:
		return "accept", nil
	case unix.NFT_GOTO:
		return "goto " + chain, nil
	case unix.NFT_JUMP:
		return "jump " + chain, nil
	}
	return "", fmt.Errorf("verdict code %d", code)
}

// conn opens a google/nftables connection in n's namespace, for reading
// tables and rules.
func (n *NFT) conn() (*gnft.Conn, func(), error) {
	var opts []gnft.ConnOption
	closeNS := func() {}
	if n.Netns != "" {
		f, err := os.Open("/run/netns/" + n.Netns)
		if err != nil {
			return nil, nil, err
		}
		closeNS = func() { f.Close() }
		opts = append(opts, gnft.WithNetNSFd(int(f.Fd())))
	}
	c, err := gnft.New(opts...)
	if err != nil {
		closeNS()
		return nil, nil, err
	}
	return c, closeNS, nil
}
