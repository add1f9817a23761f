//go:build linux

package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipproxy/vipproxy/internal/model"
)

// eventMessage encodes a conntrack event as the kernel sends it.
func eventMessage(t *testing.T, typ uint16, flags netlink.HeaderFlags, family byte, orig, reply [2]netip.AddrPort, status uint32, tcpState uint8) netlink.Message {
	t.Helper()
	tuple := func(src, dst netip.AddrPort) func(*netlink.AttributeEncoder) error {
		return func(ae *netlink.AttributeEncoder) error {
			ae.Nested(ctaTupleIP, func(ie *netlink.AttributeEncoder) error {
				if src.Addr().Is4() {
					ie.Bytes(ctaIPv4Src, src.Addr().AsSlice())
					ie.Bytes(ctaIPv4Dst, dst.Addr().AsSlice())
				} else {
					ie.Bytes(ctaIPv6Src, src.Addr().AsSlice())
					ie.Bytes(ctaIPv6Dst, dst.Addr().AsSlice())
				}
				return nil
			})
			ae.Nested(ctaTupleProto, func(pe *netlink.AttributeEncoder) error {
				pe.Uint8(ctaProtoNum, ProtoTCP)
				pe.Uint16(ctaProtoSrcPort, src.Port())
				pe.Uint16(ctaProtoDstPort, dst.Port())
				return nil
			})
			return nil
		}
	}
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.Nested(ctaTupleOrig, tuple(orig[0], orig[1]))
	ae.Nested(ctaTupleReply, tuple(reply[0], reply[1]))
	ae.Uint32(ctaStatus, status)
	ae.Nested(ctaProtoinfo, func(pe *netlink.AttributeEncoder) error {
		pe.Nested(ctaProtoinfoTCP, func(te *netlink.AttributeEncoder) error {
			te.Uint8(ctaProtoinfoTCPS, tcpState)
			return nil
		})
		return nil
	})
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(subsysCTNetlink<<8 | typ), Flags: flags}, Data: append([]byte{family, 0, 0, 0}, b...)}
}

func TestParseEvent(t *testing.T) {
	ap := netip.MustParseAddrPort
	client, vip, ep := ap("10.244.1.9:40000"), ap("10.96.0.10:80"), ap("10.244.2.5:8080")
	orig, reply := [2]netip.AddrPort{client, vip}, [2]netip.AddrPort{ep, client}
	tests := []struct {
		name                 string
		msg                  netlink.Message
		want                 EventType
		refused, established bool
		wantState            uint8
	}{
		{"new", eventMessage(t, msgCTNew, netlink.Create, unix.AF_INET, orig, reply, 0, TCPSynSent), EventNew, false, false, TCPSynSent},
		{"reset while opening", eventMessage(t, msgCTNew, 0, unix.AF_INET, orig, reply, StatusSeenReply, TCPClose), EventUpdate, true, false, TCPClose},
		{"refused: killed at the reset", eventMessage(t, msgCTDelete, 0, unix.AF_INET, orig, reply, 0, TCPSynSent), EventDestroy, true, false, TCPSynSent},
		{"established", eventMessage(t, msgCTNew, 0, unix.AF_INET, orig, reply, StatusSeenReply|StatusAssured, TCPEstablished), EventUpdate, false, true, TCPEstablished},
		{"closed after use", eventMessage(t, msgCTNew, 0, unix.AF_INET, orig, reply, StatusSeenReply|StatusAssured, TCPClose), EventUpdate, false, false, TCPClose},
		{"destroy after use", eventMessage(t, msgCTDelete, 0, unix.AF_INET, orig, reply, StatusSeenReply|StatusAssured, TCPTimeWait), EventDestroy, false, false, TCPTimeWait},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev, ok := ParseEvent(tc.msg)
			if !ok {
				t.Fatal("not parsed")
			}
			want := Flow{Family: model.IPv4, Protocol: ProtoTCP, OrigSrc: client, OrigDst: vip, ReplySrc: ep, ReplyDst: client, TCPState: tc.wantState}
			if ev.Type != tc.want || ev.Flow != want || ev.Failed() != tc.refused || (ev.Flow.TCPState == TCPEstablished) != tc.established {
				t.Errorf("got %+v (refused %v, established %v), want type %d flow %+v refused %v established %v",
					ev, ev.Failed(), ev.Flow.TCPState == TCPEstablished, tc.want, want, tc.refused, tc.established)
			}
		})
	}
	v6 := eventMessage(t, msgCTNew, netlink.Create, unix.AF_INET6, [2]netip.AddrPort{ap("[fd00::9]:4000"), ap("[fd00:96::a]:80")},
		[2]netip.AddrPort{ap("[fd00::5]:8080"), ap("[fd00::9]:4000")}, 0, TCPSynSent)
	if ev, ok := ParseEvent(v6); !ok || ev.Flow.Family != model.IPv6 || ev.Flow.ReplySrc != ap("[fd00::5]:8080") {
		t.Errorf("IPv6 event parsed as %+v, %v", ev, ok)
	}
	for name, m := range map[string]netlink.Message{
		"other subsystem": {Header: netlink.Header{Type: 2 << 8}, Data: []byte{2, 0, 0, 0}},
		"short":           {Header: netlink.Header{Type: subsysCTNetlink << 8}, Data: []byte{2}},
		"no tuple":        {Header: netlink.Header{Type: subsysCTNetlink << 8}, Data: []byte{2, 0, 0, 0}},
		"truncated": {Header: netlink.Header{Type: subsysCTNetlink << 8}, Data: func() []byte {
			d := eventMessage(t, msgCTNew, 0, unix.AF_INET, orig, reply, 0, TCPSynSent).Data
			return d[:len(d)-3]
		}()},
	} {
		if _, ok := ParseEvent(m); ok {
			t.Errorf("%s: parsed", name)
		}
	}
}

// TestEventsInNetns: on a real kernel, a connection to a closed port of
// another namespace is seen as refused and one to a listener as
// established.
func TestEventsInNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, conntrack)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed")
	}
	client, server := newNetns(t), newNetns(t)
	run(t, "ip", "link", "add", "vpct-ev0", "netns", client, "type", "veth", "peer", "name", "vpct-ev1", "netns", server)
	run(t, "ip", "-n", client, "addr", "add", "10.77.0.1/24", "dev", "vpct-ev0")
	run(t, "ip", "-n", server, "addr", "add", "10.77.0.2/24", "dev", "vpct-ev1")
	run(t, "ip", "-n", client, "link", "set", "vpct-ev0", "up")
	run(t, "ip", "-n", server, "link", "set", "vpct-ev1", "up")
	// conntrack runs in a namespace only once a rule needs it.
	cmd := exec.Command("ip", "netns", "exec", client, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader("table ip vpct_ev {\n chain out {\n  type filter hook output priority 0;\n  ct state new accept\n }\n}\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	h, err := netns.GetFromName(client)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	evs, err := SubscribeEvents(int(h), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer evs.Close()
	var l net.Listener
	inNetns(t, server, func() (err error) {
		l, err = net.Listen("tcp", "10.77.0.2:0")
		return err
	})
	defer l.Close()
	open, closed := netip.MustParseAddrPort(l.Addr().String()), netip.MustParseAddrPort("10.77.0.2:1")
	inNetns(t, client, func() error {
		c, err := net.DialTimeout("tcp", open.String(), 3*time.Second)
		if err != nil {
			return err
		}
		c.Close()
		if _, err := net.DialTimeout("tcp", closed.String(), 3*time.Second); !errors.Is(err, unix.ECONNREFUSED) {
			return fmt.Errorf("connect to a closed port: %v, want refused", err)
		}
		return nil
	})
	var refused, established bool
	for deadline := time.Now().Add(5 * time.Second); !(refused && established); time.Sleep(10 * time.Millisecond) {
		got, err := evs.Poll()
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("refused seen %v, established seen %v: %v", refused, established, err)
		}
		for _, ev := range got {
			t.Logf("event %d status %#x state %d %v", ev.Type, ev.Status, ev.Flow.TCPState, ev.Flow)
			refused = refused || (ev.Failed() && ev.Flow.OrigDst == closed)
			established = established || (ev.Flow.TCPState == TCPEstablished && ev.Flow.OrigDst == open)
		}
	}
}

// TestEventsClose: Poll on a quiet table returns at once with nothing;
// after Close it fails, and a second Close does nothing.
func TestEventsClose(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	ns := newNetns(t)
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	evs, err := SubscribeEvents(int(h), 0)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if got, err := evs.Poll(); len(got) != 0 || err != nil {
		t.Fatalf("Poll on a quiet table: %v, %v", got, err)
	}
	if took := time.Since(start); took > 50*time.Millisecond {
		t.Errorf("Poll on a quiet table took %v: it must not wait", took)
	}
	if err := evs.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := evs.Poll(); err == nil {
		t.Error("Poll after Close: no error")
	}
	if err := evs.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// BenchmarkParseEvent: one conntrack event message decoded (a connection
// makes about four: new, SYN_RECV, ESTABLISHED, destroy).
func BenchmarkParseEvent(b *testing.B) {
	t := &testing.T{}
	ap := netip.MustParseAddrPort
	m := eventMessage(t, msgCTNew, 0, unix.AF_INET, [2]netip.AddrPort{ap("10.244.1.9:40000"), ap("10.96.0.10:80")},
		[2]netip.AddrPort{ap("10.244.2.5:8080"), ap("10.244.1.9:40000")}, StatusSeenReply|StatusAssured, TCPEstablished)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := ParseEvent(m); !ok {
			b.Fatal("not parsed")
		}
	}
}
