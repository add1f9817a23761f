package nftables

// Elements in wire form. The proxier keeps every element key of its
// static maps and sets, and every map value that is not a verdict, as the
// kernel encodes it (encodeFields: each field in network order, or a
// numgen slot in host order, padded to 4 bytes): an IPv4 endpoint
// element is 20 bytes instead of about 38 of nft text, at 50,000
// Services 1.1 million of them. The element batches send those bytes as
// they are, a restart compares them with what the kernel lists without
// decoding it, and the element digest hashes them. Verdicts stay in nft
// syntax ("goto chain"), which names the chain as compactly as the
// kernel's attributes. nft text is rendered only for what the nft binary
// reads (a rebuild, the knftables fallback) and for logs.

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"

	"github.com/vipproxy/vipproxy/internal/dataplane/nfcount"
)

// width is the size of fields in wire form.
func width(fields []field) int {
	n := 0
	for _, f := range fields {
		n += f.size()
	}
	return n
}

// size is the size of f in wire form.
func (f field) size() int {
	if f == fieldAddr6 {
		return 16
	}
	return 4
}

// appendWireAddr appends a (unmapped) in wire form: 4 or 16 bytes.
func appendWireAddr(dst []byte, a netip.Addr) []byte {
	if a = a.Unmap(); a.Is4() {
		b := a.As4()
		return append(dst, b[:]...)
	}
	b := a.As16()
	return append(dst, b[:]...)
}

// appendWirePort appends port p in wire form.
func appendWirePort(dst []byte, p uint16) []byte {
	return append(binary.BigEndian.AppendUint16(dst, p), 0, 0)
}

// appendWireSlot appends numgen slot i in wire form.
func appendWireSlot(dst []byte, i int) []byte {
	return binary.NativeEndian.AppendUint32(dst, uint32(i))
}

// Text returns op with Key and Value in nft syntax. A wire-form field
// that cannot be read (a bug) is rendered in hex, which nft refuses.
func (op ElementOp) Text() ElementOp {
	if !op.wire {
		return op
	}
	op.wire = false
	l, ok := layoutOf(op.Family, op.Set)
	if !ok {
		op.Key, op.Value = fmt.Sprintf("0x%x", op.Key), fmt.Sprintf("0x%x", op.Value)
		return op
	}
	op.Key, op.Value = renderElement(l, op.Key, op.Value)
	return op
}

// renderElement returns a wire-form key and value of layout l in nft
// syntax (hex where they cannot be read).
func renderElement(l elemLayout, key, value string) (string, string) {
	k, err := decodeFields(l.key, key)
	if err != nil {
		k = fmt.Sprintf("0x%x", key)
	}
	if len(l.val) > 0 {
		v, err := decodeFields(l.val, value)
		if err != nil {
			v = fmt.Sprintf("0x%x", value)
		}
		value = v
	}
	return k, value
}

// wireText is a wire-form key of map or set name for a log line, which
// renders it (in whichever family's layout reads it) only when the line
// is written.
type wireText struct{ name, key string }

func (w wireText) LogValue() slog.Value {
	for _, f := range families {
		if l, ok := layouts[f][w.name]; ok && len(w.key) == width(l.key) {
			if k, err := decodeFields(l.key, w.key); err == nil {
				return slog.StringValue(k)
			}
		}
	}
	return slog.StringValue(fmt.Sprintf("0x%x", w.key))
}

// wireOf returns the wire form of key and value, in nft syntax, of an
// element of layout l (a verdict value is returned as it is).
func wireOf(l elemLayout, key, value string) (string, string, error) {
	k, err := encodeFields(nil, l.key, key)
	if err != nil {
		return "", "", fmt.Errorf("key: %w", err)
	}
	if len(l.val) > 0 {
		v, err := encodeFields(nil, l.val, value)
		if err != nil {
			return "", "", fmt.Errorf("value: %w", err)
		}
		value = string(v)
	}
	return string(k), value, nil
}

// decodeFields reads b (wire form) as fields, joined by " . ".
func decodeFields(fields []field, b string) (string, error) {
	out, err := appendText(nil, fields, b)
	return string(out), err
}

// appendText appends b (wire form) as fields joined by " . ".
func appendText(dst []byte, fields []field, b string) ([]byte, error) {
	for i, f := range fields {
		n := f.size()
		if len(b) < n {
			return dst, fmt.Errorf("%d bytes left for field %d", len(b), i)
		}
		if i > 0 {
			dst = append(dst, " . "...)
		}
		switch f {
		case fieldAddr4:
			dst = netip.AddrFrom4([4]byte{b[0], b[1], b[2], b[3]}).AppendTo(dst)
		case fieldAddr6:
			var a [16]byte
			copy(a[:], b)
			dst = netip.AddrFrom16(a).AppendTo(dst)
		case fieldProto:
			name, ok := protoNames[b[0]]
			if !ok {
				return dst, fmt.Errorf("field %d: unknown protocol %d", i, b[0])
			}
			dst = append(dst, name...)
		case fieldPort:
			dst = strconv.AppendUint(dst, uint64(b[0])<<8|uint64(b[1]), 10)
		case fieldSlot:
			var v [4]byte
			copy(v[:], b)
			dst = strconv.AppendUint(dst, uint64(binary.NativeEndian.Uint32(v[:])), 10)
		}
		b = b[n:]
	}
	if len(b) != 0 {
		return dst, fmt.Errorf("%d bytes after the last field", len(b))
	}
	return dst, nil
}

// wireElement returns an element as the kernel lists it in the form the
// proxier keeps it: the key's bytes, the value's bytes or, for a
// verdict, its nft syntax. It checks the sizes against layout l.
func wireElement(l elemLayout, e nfcount.Element) (key, value string, err error) {
	if len(e.Key) != width(l.key) {
		return "", "", fmt.Errorf("a %d-byte key, want %d", len(e.Key), width(l.key))
	}
	switch {
	case l.verdict != e.Verdict:
		err = fmt.Errorf("verdict data %t, want %t", e.Verdict, l.verdict)
	case l.verdict:
		value, err = decodeVerdict(e.Value)
	case len(e.Value) != width(l.val):
		err = fmt.Errorf("a %d-byte value, want %d", len(e.Value), width(l.val))
	default:
		value = string(e.Value)
	}
	if err != nil {
		k, _ := renderElement(l, string(e.Key), "")
		return "", "", fmt.Errorf("element %s: value: %w", k, err)
	}
	return string(e.Key), value, nil
}
