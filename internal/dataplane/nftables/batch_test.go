package nftables

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"sigs.k8s.io/knftables"
)

// googleMessages returns the element messages google/nftables writes for
// ops (one SetAddElements or SetDeleteElements per run of one set, at
// most per elements each): the encoding elemBatch replaced.
func googleMessages(t *testing.T, ops []ElementOp, per int) []netlink.Message {
	t.Helper()
	var sent []netlink.Message
	c, err := gnft.New(gnft.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		sent = append(sent, req...)
		return nil, errors.New("captured")
	}))
	if err != nil {
		t.Fatal(err)
	}
	var run []gnft.SetElement
	var cur ElementOp
	flush := func() {
		if len(run) == 0 {
			return
		}
		l, _ := layoutOf(cur.Family, cur.Set)
		s := &gnft.Set{Table: &gnft.Table{Name: TableName, Family: gnftFamilies[cur.Family]}, Name: cur.Set, IsMap: len(l.val) > 0 || l.verdict}
		if cur.Delete {
			err = c.SetDeleteElements(s, run)
		} else {
			err = c.SetAddElements(s, run)
		}
		if err != nil {
			t.Fatal(err)
		}
		run = nil
	}
	for i, op := range ops {
		if i > 0 && (op.Delete != cur.Delete || op.Family != cur.Family || op.Set != cur.Set || len(run) == per) {
			flush()
		}
		cur = op
		l, ok := layoutOf(op.Family, op.Set)
		if !ok {
			t.Fatalf("%+v: no layout", op)
		}
		var e gnft.SetElement
		if e.Key, err = encodeFields(nil, l.key, op.Key); err != nil {
			t.Fatal(err)
		}
		switch {
		case l.verdict:
			v := &expr.Verdict{}
			switch kind, chain, _ := strings.Cut(op.Value, " "); kind {
			case "drop":
				v.Kind = expr.VerdictDrop
			case "accept":
				v.Kind = expr.VerdictAccept
			case "goto":
				v.Kind, v.Chain = expr.VerdictGoto, chain
			case "jump":
				v.Kind, v.Chain = expr.VerdictJump, chain
			}
			e.VerdictData = v
		case len(l.val) > 0:
			if e.Val, err = encodeFields(nil, l.val, op.Value); err != nil {
				t.Fatal(err)
			}
		}
		run = append(run, e)
	}
	flush()
	_ = c.Flush() // the dial function captures, then fails the receive
	return sent
}

// batchMessages splits an encoded batch into messages.
func batchMessages(t *testing.T, buf []byte) []netlink.Message {
	t.Helper()
	var out []netlink.Message
	for len(buf) > 0 {
		var m netlink.Message
		if err := m.UnmarshalBinary(buf[:binary.NativeEndian.Uint32(buf)]); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
		buf = buf[m.Header.Length:]
	}
	return out
}

// batchOps covers every static map and set layout of both families,
// adds and deletes, and every verdict.
func batchOps() []ElementOp {
	v4, v6 := knftables.IPv4Family, knftables.IPv6Family
	return []ElementOp{
		{Family: v4, Set: mapServiceIPs, Key: "10.96.0.10 . tcp . 80", Value: "goto svc-ns/a:http"},
		{Family: v4, Set: mapServiceIPs, Key: "10.96.0.11 . udp . 53", Value: "jump int-cluster-udp-3"},
		{Family: v4, Set: mapNoEndpointIPs, Key: "10.96.0.12 . sctp . 9", Value: "drop"},
		{Family: v4, Set: mapFirewallIPs, Key: "192.0.2.1 . tcp . 443", Value: "accept"},
		{Family: v4, Set: mapServiceNodePorts, Key: "tcp . 30080", Value: "goto ext-ns/a:http"},
		{Family: v4, Set: endpointMap("cluster", "endpoints", "tcp"), Key: "10.96.0.10 . 80 . 0", Value: "10.1.2.3 . 8080"},
		{Family: v4, Set: endpointMap("cluster", "endpoints", "tcp"), Key: "10.96.0.10 . 80 . 1", Value: "10.1.2.4 . 8080"},
		{Family: v4, Set: endpointMap("local", "nodeport-endpoints", "udp"), Key: "30053 . 2", Value: "10.1.2.5 . 53"},
		{Family: v4, Set: setClusterIPs, Key: "10.96.0.10"},
		{Family: v4, Set: setHairpin, Key: "10.1.2.3 . 10.1.2.3"},
		{Delete: true, Family: v4, Set: setHairpin, Key: "10.1.2.9 . 10.1.2.9"},
		{Delete: true, Family: v4, Set: mapServiceIPs, Key: "10.96.0.13 . tcp . 80", Value: "goto svc-ns/b:http"},
		{Family: v6, Set: mapServiceIPs, Key: "fd00::a . tcp . 80", Value: "goto svc-ns/a:http"},
		{Family: v6, Set: endpointMap("cluster", "endpoints", "sctp"), Key: "fd00::a . 80 . 7", Value: "fd01::3 . 8080"},
		{Family: v6, Set: setHairpin, Key: "fd01::3 . fd01::3"},
		{Family: v6, Set: digestSet, Key: "fd00:ab::cd"},
	}
}

// TestElemBatchMatchesGoogle requires elemBatch to write, message by
// message, the bytes google/nftables wrote for the same operations (the
// encoding TestKernelElements proved against nft), including a run of
// one map longer than a message holds.
func TestElemBatchMatchesGoogle(t *testing.T) {
	ops := batchOps()
	for i := range 1203 {
		ops = append(ops, ElementOp{Family: knftables.IPv4Family, Set: endpointMap("cluster", "endpoints", "udp"),
			Key: fmt.Sprintf("10.97.%d.%d . 53 . %d", i>>8, i&255, i%10), Value: fmt.Sprintf("10.2.%d.%d . 5353", i>>8, i&255)})
	}
	ops = append(ops, batchOps()[:3]...)
	b, err := encodeOps(ops)
	if err != nil {
		t.Fatal(err)
	}
	got := batchMessages(t, b.end())
	want := googleMessages(t, ops, maxElemsPerMessage)
	if len(got) != len(want) {
		t.Fatalf("%d messages, google/nftables wrote %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Header.Type != w.Header.Type || g.Header.Flags != w.Header.Flags || !bytes.Equal(g.Data, w.Data) {
			t.Fatalf("message %d differs:\n got  %v %v % x\n want %v %v % x", i, g.Header.Type, g.Header.Flags, g.Data, w.Header.Type, w.Header.Flags, w.Data)
		}
		if i > 0 && i < len(got)-1 && g.Header.Sequence != uint32(i) {
			t.Errorf("message %d: sequence %d", i, g.Header.Sequence)
		}
	}
	if n := len(b.msgs); n != len(got)-2 {
		t.Errorf("%d messages recorded, %d element messages written", n, len(got)-2)
	}
	if d := b.describe(15); !strings.Contains(d, "{ 10.97.0.0 . 53 . 0 }") || !strings.Contains(d, "500 elements") {
		t.Errorf("describe(15) = %q, want the first of the 500 elements of the full message", d)
	}
}

// TestElemBatchListBound: long chain names split a run of one verdict
// map into messages whose element lists fit the 16-bit attribute length.
func TestElemBatchListBound(t *testing.T) {
	chain := strings.Repeat("c", 250)
	var ops []ElementOp
	for i := range 400 {
		ops = append(ops, ElementOp{Family: knftables.IPv4Family, Set: mapServiceIPs,
			Key: fmt.Sprintf("10.96.%d.%d . tcp . 80", i>>8, i&255), Value: "goto " + chain})
	}
	b, err := encodeOps(ops)
	if err != nil {
		t.Fatal(err)
	}
	msgs := batchMessages(t, b.end())
	if len(msgs) < 4 { // begin, two or more element messages, end
		t.Fatalf("%d messages, want the 400 elements split", len(msgs))
	}
	total := 0
	for _, m := range msgs[1 : len(msgs)-1] {
		if len(m.Data) > 65535 {
			t.Errorf("message of %d bytes", len(m.Data))
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			t.Fatal(err)
		}
		for ad.Next() {
			if ad.Type() == unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				inner, err := netlink.NewAttributeDecoder(ad.Bytes())
				if err != nil {
					t.Fatal(err)
				}
				for inner.Next() {
					total++
				}
			}
		}
		if err := ad.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if total != len(ops) {
		t.Errorf("%d elements decoded, want %d", total, len(ops))
	}
}

// TestElemBatchErrors: an operation that cannot be encoded names its set
// and leaves the batch as it was.
func TestElemBatchErrors(t *testing.T) {
	for _, op := range []ElementOp{
		{Family: knftables.IPv4Family, Set: "no-such-map", Key: "1"},
		{Family: knftables.IPv4Family, Set: mapServiceIPs, Key: "10.0.0.1 . tcp . 80", Value: "reject"},
		{Family: knftables.IPv4Family, Set: setClusterIPs, Key: "10.0.0.1", Value: "drop"},
		{Family: knftables.IPv6Family, Set: setClusterIPs, Key: "10.0.0.1"},
		{Family: knftables.IPv4Family, Set: setHairpin, Key: "10.0.0.1 . 10.0.0.2 . 10.0.0.3"},
	} {
		for _, before := range [][]ElementOp{nil, batchOps()[:1], batchOps()[8:9]} {
			b, err := encodeOps(before)
			if err != nil {
				t.Fatal(err)
			}
			n, msgs := len(b.buf), len(b.msgs)
			if err := b.add(op); err == nil || !strings.Contains(err.Error(), op.Set) {
				t.Errorf("add(%+v) = %v, want an error naming the set", op, err)
			}
			if len(b.buf) != n || len(b.msgs) != msgs {
				t.Errorf("add(%+v) after %d ops: batch grew from %d to %d bytes, %d to %d messages", op, len(before), n, len(b.buf), msgs, len(b.msgs))
			}
			if err := b.add(batchOps()[9]); err != nil {
				t.Fatal(err)
			}
			got := batchMessages(t, b.end())
			want := googleMessages(t, append(before, batchOps()[9]), maxElemsPerMessage)
			if len(got) != len(want) {
				t.Fatalf("after a failed add: %d messages, want %d", len(got), len(want))
			}
			for i, w := range want {
				if !bytes.Equal(got[i].Data, w.Data) {
					t.Errorf("after a failed add, message %d differs", i)
				}
			}
		}
	}
}

// BenchmarkEncodeOps measures the encoding of a cold start's element
// batch at 10,000 Services × 10 endpoints (every static element of both
// families), without the kernel.
func BenchmarkEncodeOps(b *testing.B) {
	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	bl := newBuilder(&o)
	rs := bl.build(scaleState(10000, 10))
	var ops []ElementOp
	for _, f := range families {
		ops = append(ops, slices.Collect(elementsOf(f, rs[f]))...)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := encodeOps(ops); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(ops)), "ns/element")
}

// TestAppendAddr4 holds the dotted-quad fast path to netip.ParseAddr:
// whatever it accepts, netip reads as the same IPv4 address.
func TestAppendAddr4(t *testing.T) {
	for _, s := range []string{
		"0.0.0.0", "10.96.0.10", "255.255.255.255", "1.2.3.4", "192.168.100.200",
		"256.1.1.1", "1.2.3", "1.2.3.4.5", "01.2.3.4", "1..2.3", ".1.2.3", "1.2.3.", "", "a.b.c.d",
		"1.2.3.4 ", "::1", "::ffff:1.2.3.4", "1.2.3.-4", "1000.2.3.4", "0.0.0.00",
	} {
		got, ok := appendAddr4([]byte{9}, s)
		a, err := netip.ParseAddr(s)
		want := err == nil && a.Is4()
		if ok && !want {
			t.Errorf("appendAddr4(%q) accepted what netip refuses", s)
		}
		if ok && !bytes.Equal(got[1:], a.AsSlice()) {
			t.Errorf("appendAddr4(%q) = % x, netip % x", s, got[1:], a.AsSlice())
		}
		if ok && got[0] != 9 {
			t.Errorf("appendAddr4(%q) overwrote dst", s)
		}
		if !ok && want && s != "" {
			t.Logf("appendAddr4(%q) leaves it to netip", s)
		}
		if !ok && len(got) != 1 {
			t.Errorf("appendAddr4(%q) refused but appended", s)
		}
	}
	for i := range 5000 {
		a := netip.AddrFrom4([4]byte{byte(i * 7), byte(i >> 3), byte(i * 13), byte(i)})
		got, ok := appendAddr4(nil, a.String())
		if !ok || !bytes.Equal(got, a.AsSlice()) {
			t.Fatalf("appendAddr4(%s) = % x, %v", a, got, ok)
		}
	}
}

// TestKernelFillErrors: a cold start's pipelined fill reports the nft
// transaction's error without sending, an operation that cannot be
// encoded by its set, and the kernel's refusal by the message it
// refused; it always drains its encoder.
func TestKernelFillErrors(t *testing.T) {
	ns := newNetns(t, "fill")
	n := &NFT{Netns: ns}
	ctx := context.Background()
	ready := func(err error) <-chan error {
		ch := make(chan error, 1)
		ch <- err
		return ch
	}
	var ops []ElementOp
	for i := range fillChunk + 10 {
		ops = append(ops, ElementOp{Family: knftables.IPv4Family, Set: setClusterIPs, Key: fmt.Sprintf("10.96.%d.%d", i>>8, i&255)})
	}
	boom := errors.New("boom")
	if err := n.fill(ctx, slices.Values(ops), len(ops), ready(boom)); !errors.Is(err, boom) {
		t.Errorf("fill after a failed transaction = %v, want it", err)
	}
	bad := append(slices.Clone(ops[:5]), ElementOp{Family: knftables.IPv4Family, Set: setClusterIPs, Key: "10.96.0.999"})
	if err := n.fill(ctx, slices.Values(bad), len(bad), ready(nil)); err == nil || !strings.Contains(err.Error(), "cluster-ips key") {
		t.Errorf("fill of an unencodable element = %v, want an error naming the set's key", err)
	}
	// No table in the namespace: the kernel refuses the first message.
	err := n.fill(ctx, slices.Values(ops), len(ops), ready(nil))
	if !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "add element ip vipproxy cluster-ips: 500 elements (first { 10.96.0.0 })") {
		t.Errorf("fill into a missing table = %v, want ENOENT naming the first message", err)
	}
}

var addrRE = regexp.MustCompile(`\b\d+\.\d+\.\d+\.\d+\b`)

// TestKernelFill: the pipelined fill sends every operation its sequence
// yields, whatever the count says and wherever the batches end, and
// stops ranging over the sequence at the first one it cannot encode.
func TestKernelFill(t *testing.T) {
	ns := newNetns(t, "fillall")
	n := &NFT{Netns: ns}
	ctx := context.Background()
	ready := func() <-chan error {
		ch := make(chan error, 1)
		ch <- nil
		return ch
	}
	keys := func(lo, hi int) iter.Seq[ElementOp] {
		return func(yield func(ElementOp) bool) {
			for i := lo; i < hi; i++ {
				if !yield(ElementOp{Family: knftables.IPv4Family, Set: setClusterIPs, Key: fmt.Sprintf("10.%d.%d.%d", 96+i>>16, i>>8&255, i&255)}) {
					return
				}
			}
		}
	}
	for _, tc := range []struct{ n, count int }{
		{1, 1}, {fillChunk, fillChunk}, {fillChunk + 1, fillChunk + 1}, {2*fillChunk + 3, 10}, {5, 0},
	} {
		nsNft(t, ns, "add table ip vipproxy; add set ip vipproxy cluster-ips { type ipv4_addr; }; flush set ip vipproxy cluster-ips")
		if err := n.fill(ctx, keys(0, tc.n), tc.count, ready()); err != nil {
			t.Fatalf("fill of %d (count %d): %v", tc.n, tc.count, err)
		}
		if got := len(addrRE.FindAllString(nsNft(t, ns, "list set ip vipproxy cluster-ips"), -1)); got != tc.n {
			t.Errorf("fill of %d (count %d): the set holds %d", tc.n, tc.count, got)
		}
	}
	ranged := 0
	bad := func(yield func(ElementOp) bool) {
		for op := range keys(0, fillChunk+10) {
			if ranged++; ranged == 7 {
				op.Key = "10.96.0.999"
			}
			if !yield(op) {
				return
			}
		}
	}
	if err := n.fill(ctx, bad, fillChunk+10, ready()); err == nil {
		t.Error("fill of an unencodable element succeeded")
	}
	if ranged != 7 {
		t.Errorf("fill ranged over %d operations after the unencodable 7th, want it to stop there", ranged-7)
	}
}
