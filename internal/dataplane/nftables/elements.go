package nftables

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane/nfcount"
)

// ElementOp is one addition or deletion of an element of a static map or
// set of vipproxy's table (see staticMaps and staticSets), written in nft
// syntax: Key is the fields joined by " . ", Value the map value ("goto
// chain", "drop", or fields joined by " . "), "" for a set.
type ElementOp struct {
	Delete bool
	Family knftables.Family
	Set    string
	Key    string
	Value  string
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

var protoNumbers = map[string]byte{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}

// encodeFields appends the kernel encoding of s (fields joined by " . ")
// to dst.
func encodeFields(dst []byte, fields []field, s string) ([]byte, error) {
	for i, f := range fields {
		part := s
		if i < len(fields)-1 {
			j := strings.Index(s, " . ")
			if j < 0 {
				return nil, fmt.Errorf("%q: want %d fields", s, len(fields))
			}
			part, s = s[:j], s[j+3:]
		} else if strings.Contains(s, " . ") {
			return nil, fmt.Errorf("%q: more than %d fields", s, len(fields))
		}
		switch f {
		case fieldAddr4, fieldAddr6:
			a, err := netip.ParseAddr(part)
			if err != nil || a.Is4() != (f == fieldAddr4) {
				return nil, fmt.Errorf("field %d %q: not an IPv%s address", i, part, map[bool]string{true: "4", false: "6"}[f == fieldAddr4])
			}
			dst = append(dst, a.AsSlice()...)
		case fieldProto:
			n, ok := protoNumbers[part]
			if !ok {
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

// verdict parses a map value of a verdict map.
func verdict(s string) (*expr.Verdict, error) {
	switch {
	case s == "drop":
		return &expr.Verdict{Kind: expr.VerdictDrop}, nil
	case s == "accept":
		return &expr.Verdict{Kind: expr.VerdictAccept}, nil
	case strings.HasPrefix(s, "goto "):
		return &expr.Verdict{Kind: expr.VerdictGoto, Chain: s[len("goto "):]}, nil
	case strings.HasPrefix(s, "jump "):
		return &expr.Verdict{Kind: expr.VerdictJump, Chain: s[len("jump "):]}, nil
	}
	return nil, fmt.Errorf("verdict %q: want drop, accept, goto or jump", s)
}

// encodeElement returns the netlink form of op.
func encodeElement(op ElementOp) (gnft.SetElement, error) {
	l, ok := layoutOf(op.Family, op.Set)
	if !ok {
		return gnft.SetElement{}, fmt.Errorf("%s %s: not a static map or set", op.Family, op.Set)
	}
	var e gnft.SetElement
	var err error
	if e.Key, err = encodeFields(make([]byte, 0, 24), l.key, op.Key); err != nil {
		return e, fmt.Errorf("%s %s key: %w", op.Family, op.Set, err)
	}
	switch {
	case l.verdict:
		if e.VerdictData, err = verdict(op.Value); err != nil {
			return e, fmt.Errorf("%s %s value: %w", op.Family, op.Set, err)
		}
	case len(l.val) > 0:
		if e.Val, err = encodeFields(make([]byte, 0, 20), l.val, op.Value); err != nil {
			return e, fmt.Errorf("%s %s value: %w", op.Family, op.Set, err)
		}
	case op.Value != "":
		return e, fmt.Errorf("%s %s: a set element has no value (got %q)", op.Family, op.Set, op.Value)
	}
	return e, nil
}

// maxElemsPerMessage bounds the elements of one netlink message: the
// element list is one nested attribute, whose length field has 16 bits.
// The largest element (IPv6 key of 24 bytes, IPv6 value of 20, headers)
// is under 100 bytes.
const maxElemsPerMessage = 500

// RunElements implements Elementer: it sends ops as one nfnetlink batch
// (atomic, like `nft -f`), without the nft binary's parsing, which is what
// a full sync of 100,000 elements spends its time on.
func (n *NFT) RunElements(ctx context.Context, ops []ElementOp) error {
	send, err := n.prepareElements(ops)
	if err != nil {
		return err
	}
	return send(ctx)
}

// prepareElements encodes ops into one netlink batch and returns the
// function that sends it (atomically) and releases what it holds; called
// with a done ctx, that function only releases. Encoding and sending are
// separate so that a cold start encodes one batch while the kernel
// inserts the previous one.
func (n *NFT) prepareElements(ops []ElementOp) (send func(context.Context) error, err error) {
	if len(ops) == 0 {
		return func(context.Context) error { return nil }, nil
	}
	conn, closeNS, err := n.conn(true)
	if err != nil {
		return nil, fmt.Errorf("nft netlink: %w", err)
	}
	defer func() {
		if err != nil {
			closeNS()
		}
	}()
	tables := map[knftables.Family]*gnft.Table{}
	var batch []gnft.SetElement
	var cur ElementOp
	queue := func() error {
		if len(batch) == 0 {
			return nil
		}
		t := tables[cur.Family]
		if t == nil {
			t = &gnft.Table{Name: TableName, Family: gnftFamilies[cur.Family]}
			tables[cur.Family] = t
		}
		l, _ := layoutOf(cur.Family, cur.Set)
		s := &gnft.Set{Table: t, Name: cur.Set, IsMap: len(l.val) > 0 || l.verdict}
		var err error
		if cur.Delete {
			err = conn.SetDeleteElements(s, batch)
		} else {
			err = conn.SetAddElements(s, batch)
		}
		batch = batch[:0]
		return err
	}
	for i, op := range ops {
		if i > 0 && (op.Delete != cur.Delete || op.Family != cur.Family || op.Set != cur.Set || len(batch) == maxElemsPerMessage) {
			if err := queue(); err != nil {
				return nil, fmt.Errorf("nft netlink: %w", err)
			}
		}
		cur = op
		e, err := encodeElement(op)
		if err != nil {
			return nil, fmt.Errorf("nft netlink: %w", err)
		}
		batch = append(batch, e)
	}
	if err := queue(); err != nil {
		return nil, fmt.Errorf("nft netlink: %w", err)
	}
	return func(ctx context.Context) error {
		defer closeNS()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("nft netlink: %w", err)
		}
		if err := conn.Flush(); err != nil {
			return fmt.Errorf("nft netlink: %s: %w", describeOps(ops), err)
		}
		return nil
	}, nil
}

// fillChunk is the number of elements per batch when a cold start fills
// its maps in a pipeline.
const fillChunk = 32 << 10

// fill adds ops (to maps of tables that are not hooked in, so they need
// not be atomic) in batches of fillChunk elements, encoding the next
// batch while the kernel inserts the current one; before sending the
// first it waits for ready (the nft transaction that creates the maps,
// run meanwhile). It stops at the first error.
func (n *NFT) fill(ctx context.Context, ops []ElementOp, ready <-chan error) error {
	type prepared struct {
		send func(context.Context) error
		err  error
	}
	ch := make(chan prepared, 1)
	go func() {
		defer close(ch)
		for lo := 0; lo < len(ops); lo += fillChunk {
			send, err := n.prepareElements(ops[lo:min(lo+fillChunk, len(ops))])
			ch <- prepared{send, err}
			if err != nil {
				return
			}
		}
	}()
	err := <-ready
	done, cancel := context.WithCancel(ctx)
	defer cancel()
	for b := range ch {
		switch {
		case b.err != nil:
			err = cmp.Or(err, b.err)
		case err != nil:
			cancel()
			_ = b.send(done) // only releases
		default:
			err = b.send(ctx)
		}
	}
	return err
}

// describeOps names the first operation of a failed batch for the error.
func describeOps(ops []ElementOp) string {
	op := ops[0]
	verb := "add"
	if op.Delete {
		verb = "delete"
	}
	return fmt.Sprintf("batch of %d element operations (first: %s element %s %s %s { %s })", len(ops), verb, op.Family, TableName, op.Set, op.Key)
}

// conn opens a netlink connection in n's namespace. With big, its socket
// buffers are raised (SO_SNDBUFFORCE, needs CAP_NET_ADMIN) so that one
// batch of 100,000s of elements fits in one sendmsg, as nft does.
func (n *NFT) conn(big bool) (*gnft.Conn, func(), error) {
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
	if big {
		opts = append(opts, gnft.WithSockOptions(func(c *netlink.Conn) error {
			rc, err := c.SyscallConn()
			if err != nil {
				return err
			}
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 256<<20)
				if serr == nil {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
				}
			}); err != nil {
				return err
			}
			if serr != nil {
				return fmt.Errorf("raising netlink socket buffers: %w", serr)
			}
			return nil
		}))
	}
	c, err := gnft.New(opts...)
	if err != nil {
		closeNS()
		return nil, nil, err
	}
	return c, closeNS, nil
}

// decodeElement is encodeElement's inverse: an element as the kernel
// lists it, in nft syntax.
func decodeElement(l elemLayout, e nfcount.Element) (key, value string, err error) {
	if key, err = decodeFields(l.key, e.Key); err != nil {
		return "", "", fmt.Errorf("key: %w", err)
	}
	switch {
	case l.verdict != e.Verdict:
		err = fmt.Errorf("verdict data %t, want %t", e.Verdict, l.verdict)
	case l.verdict:
		value, err = decodeVerdict(e.Value)
	case len(l.val) > 0:
		value, err = decodeFields(l.val, e.Value)
	}
	if err != nil {
		return "", "", fmt.Errorf("element %s: value: %w", key, err)
	}
	return key, value, nil
}

// decodeFields reads b as fields, joined by " . ".
func decodeFields(fields []field, b []byte) (string, error) {
	var sb strings.Builder
	for i, f := range fields {
		n := 4
		if f == fieldAddr6 {
			n = 16
		}
		if len(b) < n {
			return "", fmt.Errorf("%d bytes left for field %d", len(b), i)
		}
		if i > 0 {
			sb.WriteString(" . ")
		}
		switch f {
		case fieldAddr4:
			sb.WriteString(netip.AddrFrom4([4]byte(b[:4])).String())
		case fieldAddr6:
			sb.WriteString(netip.AddrFrom16([16]byte(b[:16])).String())
		case fieldProto:
			name, ok := protoNames[b[0]]
			if !ok {
				return "", fmt.Errorf("field %d: unknown protocol %d", i, b[0])
			}
			sb.WriteString(name)
		case fieldPort:
			sb.WriteString(strconv.Itoa(int(binary.BigEndian.Uint16(b))))
		case fieldSlot:
			sb.WriteString(strconv.FormatUint(uint64(binary.NativeEndian.Uint32(b)), 10))
		}
		b = b[n:]
	}
	if len(b) != 0 {
		return "", fmt.Errorf("%d bytes after the last field", len(b))
	}
	return sb.String(), nil
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
