//go:build linux

package conntrack

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Events is a subscription to the conntrack events of one network
// namespace's table. It needs CAP_NET_ADMIN.
type Events struct {
	c   *netlink.Conn
	rc  syscall.RawConn
	buf []byte
}

// SubscribeEvents subscribes to the given event kinds (none: all three)
// of the table of network namespace netnsFD (0: the calling thread's).
// The socket's receive buffer is raised to bufBytes when that is more than
// the default (bursts of events overflow a small one: the kernel then
// drops events and Receive returns ENOBUFS once).
func SubscribeEvents(netnsFD int, bufBytes int, kinds ...EventType) (*Events, error) {
	if len(kinds) == 0 {
		kinds = []EventType{EventNew, EventUpdate, EventDestroy}
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netnsFD})
	if err != nil {
		return nil, fmt.Errorf("conntrack: events: %w", err)
	}
	for _, k := range kinds {
		if err := c.JoinGroup(uint32(k)); err != nil {
			c.Close()
			return nil, fmt.Errorf("conntrack: events: join group %d: %w", k, err)
		}
	}
	if bufBytes > 0 {
		if err := c.SetReadBuffer(bufBytes); err != nil {
			c.Close()
			return nil, fmt.Errorf("conntrack: events: receive buffer: %w", err)
		}
	}
	rc, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("conntrack: events: %w", err)
	}
	return &Events{c: c, rc: rc, buf: make([]byte, 64<<10)}, nil
}

// maxBatch bounds the datagrams one Receive reads.
const maxBatch = 256

// Receive blocks until events arrive and returns them, with those already
// queued behind them (up to a few hundred). An error wrapping unix.ENOBUFS
// means events were lost (the subscription goes on); other errors end it.
// Not safe for concurrent use.
//
// It reads the socket itself, one datagram per event, into one buffer:
// netlink.Conn.Receive peeks each datagram's size first and allocates per
// message, which cost about three times the CPU under a connection load.
func (e *Events) Receive() ([]Event, error) {
	var out []Event
	for i := 0; i < maxBatch; i++ {
		var n int
		var rerr error
		first := i == 0
		err := e.rc.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), e.buf, unix.MSG_DONTWAIT)
			// Block (in the poller) for the first datagram only.
			return !(first && rerr == unix.EAGAIN)
		})
		if err != nil {
			return out, err
		}
		if rerr == unix.EAGAIN || rerr == unix.EINTR {
			break
		}
		if rerr != nil {
			if len(out) > 0 && rerr == unix.ENOBUFS {
				return out, nil // reported by the next call
			}
			return out, fmt.Errorf("conntrack: events: %w", rerr)
		}
		out = parseDatagram(e.buf[:n], out)
	}
	return out, nil
}

// parseDatagram appends the events of the netlink messages in b to out.
func parseDatagram(b []byte, out []Event) []Event {
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			break
		}
		m := netlink.Message{Header: netlink.Header{
			Length: uint32(l),
			Type:   netlink.HeaderType(binary.NativeEndian.Uint16(b[4:])),
			Flags:  netlink.HeaderFlags(binary.NativeEndian.Uint16(b[6:])),
		}, Data: b[unix.NLMSG_HDRLEN:l]}
		if ev, ok := ParseEvent(m); ok {
			out = append(out, ev)
		}
		l = (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
		if l > len(b) {
			break
		}
		b = b[l:]
	}
	return out
}

// Close ends the subscription; a blocked Receive returns an error.
func (e *Events) Close() error { return e.c.Close() }

// Conntrack netlink message and attribute numbers
// (linux/netfilter/nfnetlink_conntrack.h).
const (
	subsysCTNetlink  = 1
	msgCTNew         = 0
	msgCTDelete      = 2
	ctaTupleOrig     = 1
	ctaTupleReply    = 2
	ctaStatus        = 3
	ctaProtoinfo     = 4
	ctaZone          = 18
	ctaTupleIP       = 1
	ctaTupleProto    = 2
	ctaIPv4Src       = 1
	ctaIPv4Dst       = 2
	ctaIPv6Src       = 3
	ctaIPv6Dst       = 4
	ctaProtoNum      = 1
	ctaProtoSrcPort  = 2
	ctaProtoDstPort  = 3
	ctaProtoinfoTCP  = 1
	ctaProtoinfoTCPS = 1
)

// ParseEvent decodes one conntrack event message; ok is false for other
// messages and malformed ones.
func ParseEvent(m netlink.Message) (ev Event, ok bool) {
	if m.Header.Type>>8 != subsysCTNetlink || len(m.Data) < 4 {
		return ev, false
	}
	switch m.Header.Type & 0xff {
	case msgCTNew:
		ev.Type = EventUpdate
		if m.Header.Flags&netlink.Create != 0 {
			ev.Type = EventNew
		}
	case msgCTDelete:
		ev.Type = EventDestroy
	default:
		return ev, false
	}
	switch m.Data[0] {
	case unix.AF_INET:
		ev.Flow.Family = model.IPv4
	case unix.AF_INET6:
		ev.Flow.Family = model.IPv6
	default:
		return ev, false
	}
	ok = true
	eachAttr(m.Data[4:], func(typ uint16, v []byte) {
		switch typ {
		case ctaTupleOrig:
			ev.Flow.Protocol, ev.Flow.OrigSrc, ev.Flow.OrigDst = parseTuple(v)
		case ctaTupleReply:
			_, ev.Flow.ReplySrc, ev.Flow.ReplyDst = parseTuple(v)
		case ctaStatus:
			if len(v) == 4 {
				ev.Status = binary.BigEndian.Uint32(v)
			}
		case ctaZone:
			if len(v) == 2 {
				ev.Flow.Zone = binary.BigEndian.Uint16(v)
			}
		case ctaProtoinfo:
			eachAttr(v, func(typ uint16, v []byte) {
				if typ == ctaProtoinfoTCP {
					eachAttr(v, func(typ uint16, v []byte) {
						if typ == ctaProtoinfoTCPS && len(v) == 1 {
							ev.Flow.TCPState = v[0]
						}
					})
				}
			})
		}
	}, &ok)
	if !ok || !ev.Flow.OrigDst.IsValid() {
		return Event{}, false
	}
	return ev, true
}

// eachAttr calls fn with the type (flags stripped) and payload of every
// netlink attribute in b. A malformed list clears *ok when ok is not nil.
// Decoding by hand: netlink.AttributeDecoder cost 29 allocations an event.
func eachAttr(b []byte, fn func(typ uint16, v []byte), ok ...*bool) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		if l < 4 || l > len(b) {
			if len(ok) > 0 {
				*ok[0] = false
			}
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:])&0x3fff, b[4:l])
		l = (l + 3) &^ 3
		if l > len(b) {
			return
		}
		b = b[l:]
	}
}

// parseTuple reads a CTA_TUPLE_* nest: protocol, source and destination.
func parseTuple(b []byte) (proto uint8, src, dst netip.AddrPort) {
	var sa, da netip.Addr
	var sp, dp uint16
	eachAttr(b, func(typ uint16, v []byte) {
		switch typ {
		case ctaTupleIP:
			eachAttr(v, func(typ uint16, v []byte) {
				a, ok := netip.AddrFromSlice(v)
				if !ok {
					return
				}
				switch typ {
				case ctaIPv4Src, ctaIPv6Src:
					sa = a
				case ctaIPv4Dst, ctaIPv6Dst:
					da = a
				}
			})
		case ctaTupleProto:
			eachAttr(v, func(typ uint16, v []byte) {
				switch {
				case typ == ctaProtoNum && len(v) == 1:
					proto = v[0]
				case typ == ctaProtoSrcPort && len(v) == 2:
					sp = binary.BigEndian.Uint16(v)
				case typ == ctaProtoDstPort && len(v) == 2:
					dp = binary.BigEndian.Uint16(v)
				}
			})
		}
	})
	if sa.IsValid() {
		src = netip.AddrPortFrom(sa.Unmap(), sp)
	}
	if da.IsValid() {
		dst = netip.AddrPortFrom(da.Unmap(), dp)
	}
	return proto, src, dst
}
