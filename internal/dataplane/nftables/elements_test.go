package nftables

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/model"
)

func TestEncodeFields(t *testing.T) {
	slot1 := binary.NativeEndian.AppendUint32(nil, 1) // numgen's result is in host order
	cases := []struct {
		name   string
		fields []field
		in     string
		want   []byte
		errHas string
	}{
		{"service key", []field{fieldAddr4, fieldProto, fieldPort}, "10.96.0.10 . tcp . 80", []byte{10, 96, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0}, ""},
		{"nodeport key", []field{fieldProto, fieldPort}, "sctp . 30080", []byte{132, 0, 0, 0, 0x75, 0x80, 0, 0}, ""},
		{"endpoint key", []field{fieldPort, fieldSlot}, "53 . 1", append([]byte{0, 53, 0, 0}, slot1...), ""},
		{"ipv6 set", []field{fieldAddr6}, "fd00::1", []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, ""},
		{"too few fields", []field{fieldAddr4, fieldPort}, "10.0.0.1", nil, "want 2 fields"},
		{"too many fields", []field{fieldAddr4}, "10.0.0.1 . 80", nil, "more than 1 fields"},
		{"v6 in v4 field", []field{fieldAddr4}, "fd00::1", nil, "not an IPv4 address"},
		{"bad protocol", []field{fieldProto, fieldPort}, "icmp . 1", nil, "unknown protocol"},
		{"port out of range", []field{fieldPort}, "65536", nil, "not a port"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := encodeFields(nil, c.fields, c.in)
			if c.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), c.errHas) {
					t.Fatalf("err = %v, want one containing %q", err, c.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, c.want) {
				t.Errorf("encode %q = %v, want %v", c.in, got, c.want)
			}
		})
	}
}

// TestElementLayouts checks that the netlink layouts name exactly the
// static maps and sets and give each as many fields as its nft type.
func TestElementLayouts(t *testing.T) {
	for _, ip := range []string{"ip", "ip6"} {
		ls := elemLayouts(ip)
		n := 0
		for _, m := range append(staticMaps(ip), staticSets(ip)...) {
			n++
			l, ok := ls[m.name]
			if !ok {
				t.Errorf("%s %s: no element layout", ip, m.name)
				continue
			}
			key, val, isMap := strings.Cut(m.typ, " : ")
			if got, want := len(l.key), strings.Count(key, " . ")+1; got != want {
				t.Errorf("%s %s: layout key has %d fields, type %q has %d", ip, m.name, got, m.typ, want)
			}
			switch {
			case !isMap && (l.verdict || l.val != nil):
				t.Errorf("%s %s: a set with a value layout", ip, m.name)
			case isMap && val == "verdict" && !l.verdict:
				t.Errorf("%s %s: verdict map without verdict layout", ip, m.name)
			case isMap && val != "verdict" && len(l.val) != strings.Count(val, " . ")+1:
				t.Errorf("%s %s: layout value has %d fields, type %q", ip, m.name, len(l.val), m.typ)
			}
		}
		if len(ls) != n {
			t.Errorf("%s: %d layouts for %d static maps and sets", ip, len(ls), n)
		}
	}
}

// TestKernelElements programs the same States once through nft alone and
// once through the netlink paths (cold start in three steps, element-only
// partial syncs) in two namespaces, and requires nft to list identical
// tables: the netlink encoding means exactly what nft's own does.
func TestKernelElements(t *testing.T) {
	ctx := context.Background()
	nsRef, nsFast := newNetns(t, "elref"), newNetns(t, "elfast")
	ref := &countingTransport{Transport: &NFT{Netns: nsRef}} // hides Elementer
	fast := &elemSpy{NFT: &NFT{Netns: nsFast}}
	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	pRef, err := New(o, ref)
	if err != nil {
		t.Fatal(err)
	}
	pFast, err := New(o, fast)
	if err != nil {
		t.Fatal(err)
	}
	list := func(ns string) string {
		return canonical(nsNft(t, ns, "list table ip vipproxy")) + canonical(nsNft(t, ns, "list table ip6 vipproxy"))
	}
	compare := func(step string) {
		t.Helper()
		if a, b := list(nsRef), list(nsFast); a != b {
			t.Fatalf("%s: tables differ:\n--- nft\n%s\n--- netlink\n%s", step, a, b)
		}
	}
	stA := allScenarioPorts()
	for _, p := range []*Proxier{pRef, pFast} {
		if err := p.Sync(ctx, stA, true); err != nil {
			t.Fatalf("cold start: %v", err)
		}
	}
	compare("cold start")
	if !strings.Contains(list(nsFast), "10.96.0.10 . 80 . 2 : 10.1.2.6 . 8080") {
		t.Fatalf("endpoint element missing after cold start:\n%s", list(nsFast))
	}

	// An endpoint added to a port whose chain exists goes as elements.
	stB := allScenarioPorts()
	stB.Ports[0].Endpoints = append(stB.Ports[0].Endpoints, dataplanetest.EP("10.1.2.250", 8080, false))
	dataplanetest.Fill(stB.Ports[0])
	// An endpoint replaced: same chains, only elements change.
	stC := allScenarioPorts()
	stC.Ports[0].Endpoints[0].IP = netip.MustParseAddr("10.1.2.251")
	dataplanetest.Fill(stC.Ports[0])
	runs := fast.runs
	for _, st := range []struct {
		name string
		st   *model.State
	}{{"add endpoint", stB}, {"back", stA}, {"back again", stA}, {"noise", dataplanetest.NoiseState()}, {"all", stA}, {"all again", stA}, {"replace endpoint", stC}, {"back to all", stA}} {
		for _, p := range []*Proxier{pRef, pFast} {
			if err := p.Sync(ctx, st.st, false); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
		}
		compare(st.name)
	}

	if fast.runs-runs < 2 {
		t.Errorf("%d element-only syncs went over netlink, want at least 2", fast.runs-runs)
	}
	if !strings.Contains(list(nsFast), "10.1.2.6 . 8080") {
		t.Errorf("lost endpoint elements:\n%s", list(nsFast))
	}

	// A batch the kernel refuses (deleting an element that is not there)
	// changes nothing.
	before := list(nsFast)
	err = fast.RunElements(ctx, []ElementOp{
		{Family: knftables.IPv4Family, Set: setClusterIPs, Key: "10.99.99.99"},
		{Delete: true, Family: knftables.IPv4Family, Set: setClusterIPs, Key: "10.99.99.98"},
	})
	if err == nil {
		t.Fatal("deleting a missing element succeeded")
	}
	if !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "delete element ip vipproxy cluster-ips: 1 elements (first { 10.99.99.98 })") {
		t.Errorf("err = %v, want ENOENT naming the delete message", err)
	}
	if after := list(nsFast); after != before {
		t.Errorf("failed batch changed the table:\n%s", after)
	}
}

// canonical sorts the chains, maps and sets of an nft table listing: nft
// lists them in creation order, which the cold start changes (base chains
// last) without changing the meaning.
func canonical(listing string) string {
	var head, blocks []string
	var cur []string
	for _, l := range strings.Split(listing, "\n") {
		switch {
		case cur != nil:
			cur = append(cur, l)
			if l == "\t}" {
				blocks = append(blocks, strings.Join(cur, "\n"))
				cur = nil
			}
		case strings.HasPrefix(l, "\t") && strings.HasSuffix(l, "{"):
			cur = []string{l}
		case l != "":
			head = append(head, l)
		}
	}
	sort.Strings(blocks)
	return strings.Join(head, "\n") + "\n" + strings.Join(blocks, "\n")
}

// elemSpy counts element batches sent over netlink.
type elemSpy struct {
	*NFT
	runs int
}

func (e *elemSpy) RunElements(ctx context.Context, ops []ElementOp) error {
	e.runs++
	return e.NFT.RunElements(ctx, ops)
}

// buildBoth builds st twice: over at least four goroutines (fragments
// and elements, see builder.fragments and ruleset.addAll), and one port at
// a time.
func buildBoth(st *model.State) (par, ser map[knftables.Family]*ruleset) {
	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4)) // parallel on any machine
	par = newBuilder(&o).build(st)
	defer func(n int) { parallelFrom = n }(parallelFrom)
	parallelFrom = 1 << 30
	return par, newBuilder(&o).build(st)
}

// TestFragmentsParallel builds a State large enough for parallel fragment
// building and requires the same rulesets as a serial build.
func TestFragmentsParallel(t *testing.T) {
	st := scaleState(2*parallelFrom+7, 3)
	got, want := buildBoth(st)
	for _, f := range families {
		if !reflect.DeepEqual(elemValues(got[f]), elemValues(want[f])) || !reflect.DeepEqual(got[f].chains, want[f].chains) {
			t.Errorf("%s: parallel build differs from serial build", f)
		}
		if n := got[f].elems[mapServiceIPs].Len(); f == knftables.IPv4Family && n != len(st.Ports) {
			t.Errorf("%s: %d service-ips elements, want %d", f, n, len(st.Ports))
		}
	}
}

// TestAddAllMatchesAdd builds, with its elements added over several
// goroutines (addAll), a State whose ports also fight over map keys (two
// Services on one ClusterIP, port and NodePort) and share set keys (one
// endpoint behind two Services), and requires what adding the ports one
// by one gives: every element with its owner and user count, the ports
// waiting for a key, and the digest.
func TestAddAllMatchesAdd(t *testing.T) {
	st := scaleState(2*parallelFrom+7, 3)
	for i := range 40 {
		// A twin of port i under another name: same ClusterIP, NodePort
		// and endpoints. Names before and after the original's.
		orig := st.Ports[i*97]
		sp := *orig
		sp.Name.Name = fmt.Sprintf("%s-%c", map[bool]string{true: "a", false: "zz"}[i%2 == 0], 'a'+i%26)
		st.Ports = append(st.Ports, dataplanetest.Fill(&sp))
	}
	got, want := buildBoth(st)
	type elemView struct {
		owner, value string
		n            int32
	}
	view := func(rs *ruleset) (map[string]map[string]elemView, map[elemID][]string) {
		elems := map[string]map[string]elemView{}
		for name, tb := range rs.elems {
			m := map[string]elemView{}
			for k, e := range tb.All() {
				m[k] = elemView{e.owner().name.String(), e.value(), e.n}
			}
			elems[name] = m
		}
		waiting := map[elemID][]string{}
		for id, l := range rs.waiting {
			for _, pe := range l {
				waiting[id] = append(waiting[id], pe.name.String())
			}
		}
		return elems, waiting
	}
	for _, f := range families {
		ge, gw := view(got[f])
		we, ww := view(want[f])
		if diff := cmp.Diff(we, ge, cmp.AllowUnexported(elemView{})); diff != "" {
			t.Errorf("%s: elements differ from adding one by one (-want +got):\n%s", f, diff)
		}
		if diff := cmp.Diff(ww, gw); diff != "" {
			t.Errorf("%s: waiting ports differ (-want +got):\n%s", f, diff)
		}
		if f == knftables.IPv4Family && len(ww) == 0 {
			t.Errorf("%s: no port waits for a key: the State has no conflict to check", f)
		}
		if got[f].sum != want[f].sum {
			t.Errorf("%s: digest %x, want %x", f, got[f].sum, want[f].sum)
		}
		if !reflect.DeepEqual(got[f].chains, want[f].chains) || !reflect.DeepEqual(got[f].chainRefs, want[f].chainRefs) {
			t.Errorf("%s: chains differ", f)
		}
	}
}
