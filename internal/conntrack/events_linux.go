//go:build linux

package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Events is a subscription to the conntrack events of one network
// namespace's table. It needs CAP_NET_ADMIN.
type Events struct {
	c *netlink.Conn
}

// SubscribeEvents subscribes to the given event kinds (none: all three) of the table of network namespace netnsFD (0: the calling
// thread's). The socket's receive buffer is raised to bufBytes when that
// is more than the default (bursts of events overflow a small one: the
// kernel then drops events and Receive returns ENOBUFS once).
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
	return &Events{c: c}, nil
}

// Receive blocks until events arrive and returns them. An error wrapping
// unix.ENOBUFS means events were lost (the subscription goes on); other
// errors end it.
func (e *Events) Receive() ([]Event, error) {
	msgs, err := e.c.Receive()
	if err != nil {
		return nil, err
	}
	out := make([]Event, 0, len(msgs))
	for _, m := range msgs {
		if ev, ok := ParseEvent(m); ok {
			out = append(out, ev)
		}
	}
	return out, nil
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
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return ev, false
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleOrig:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				ev.Flow.Protocol, ev.Flow.OrigSrc, ev.Flow.OrigDst = parseTuple(nad)
				return nil
			})
		case ctaTupleReply:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				_, ev.Flow.ReplySrc, ev.Flow.ReplyDst = parseTuple(nad)
				return nil
			})
		case ctaStatus:
			ev.Status = ad.Uint32()
		case ctaZone:
			ev.Flow.Zone = ad.Uint16()
		case ctaProtoinfo:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					if nad.Type() == ctaProtoinfoTCP {
						nad.Nested(func(tad *netlink.AttributeDecoder) error {
							for tad.Next() {
								if tad.Type() == ctaProtoinfoTCPS {
									ev.Flow.TCPState = tad.Uint8()
								}
							}
							return nil
						})
					}
				}
				return nil
			})
		}
	}
	if ad.Err() != nil || !ev.Flow.OrigDst.IsValid() {
		return Event{}, false
	}
	return ev, true
}

// parseTuple reads a CTA_TUPLE_* nest: protocol, source and destination.
func parseTuple(ad *netlink.AttributeDecoder) (proto uint8, src, dst netip.AddrPort) {
	var sa, da netip.Addr
	var sp, dp uint16
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleIP:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					a, ok := netip.AddrFromSlice(nad.Bytes())
					if !ok {
						return errors.New("bad address")
					}
					switch nad.Type() {
					case ctaIPv4Src, ctaIPv6Src:
						sa = a
					case ctaIPv4Dst, ctaIPv6Dst:
						da = a
					}
				}
				return nil
			})
		case ctaTupleProto:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					switch nad.Type() {
					case ctaProtoNum:
						proto = nad.Uint8()
					case ctaProtoSrcPort:
						sp = nad.Uint16()
					case ctaProtoDstPort:
						dp = nad.Uint16()
					}
				}
				return nil
			})
		}
	}
	if sa.IsValid() {
		src = netip.AddrPortFrom(sa.Unmap(), sp)
	}
	if da.IsValid() {
		dst = netip.AddrPortFrom(da.Unmap(), dp)
	}
	return proto, src, dst
}
