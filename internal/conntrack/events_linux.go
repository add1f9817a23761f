//go:build linux

package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"unsafe"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Events is a subscription to the conntrack events of one network
// namespace's table. It needs CAP_NET_ADMIN.
//
// It is read by polling (Poll) and its socket never joins the Go
// runtime's poller: under a connection load the kernel queues tens of
// thousands of events a second, and a socket in the poller wakes an idle
// thread in epoll_wait for each one even while nobody reads it, which cost
// more CPU than reading the events; a reader blocked on the socket is woken
// by each first event, in the path of the packet that caused it.
type Events struct {
	mu     sync.Mutex // held by Poll; Close takes it to close fd
	fd     int
	closed bool
	buf    []byte         // slots of slotBytes, one datagram each
	hdrs   []unix.Mmsghdr // one per slot, pointing into buf
	iovs   []unix.Iovec   // one per slot
}

// A receive reads up to slots datagrams per system call (recvmmsg), each
// into slotBytes: one conntrack event takes a few hundred.
const (
	slots     = 64
	slotBytes = 4096
)

// SubscribeEvents subscribes to the given event kinds (none: all three)
// of the table of network namespace netnsFD (0: the calling thread's).
// The socket's receive buffer is raised to bufBytes when that is more than
// the default (bursts of events overflow a small one: the kernel then
// drops events and Receive returns ENOBUFS once).
func SubscribeEvents(netnsFD int, bufBytes int, kinds ...EventType) (*Events, error) {
	if len(kinds) == 0 {
		kinds = []EventType{EventNew, EventUpdate, EventDestroy}
	}
	fd, err := socketIn(netnsFD)
	if err != nil {
		return nil, fmt.Errorf("conntrack: events: %w", err)
	}
	if err := setupEvents(fd, bufBytes, kinds); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("conntrack: events: %w", err)
	}
	e := &Events{fd: fd, buf: make([]byte, slots*slotBytes),
		hdrs: make([]unix.Mmsghdr, slots), iovs: make([]unix.Iovec, slots)}
	for i := range e.hdrs {
		e.iovs[i].Base = &e.buf[i*slotBytes]
		e.iovs[i].SetLen(slotBytes)
		e.hdrs[i].Hdr.Iov = &e.iovs[i]
		e.hdrs[i].Hdr.SetIovlen(1)
	}
	return e, nil
}

// socketIn opens a netfilter netlink socket in network namespace netnsFD
// (0: the calling thread's). A socket belongs to the namespace it was
// created in, so for another namespace a thread of its own enters it,
// creates the socket and is then discarded (never unlocked).
func socketIn(netnsFD int) (int, error) {
	open := func() (int, error) {
		return unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	}
	if netnsFD == 0 {
		return open()
	}
	type result struct {
		fd  int
		err error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(netnsFD, unix.CLONE_NEWNET); err != nil {
			res <- result{-1, fmt.Errorf("enter network namespace: %w", err)}
			return
		}
		fd, err := open()
		res <- result{fd, err}
	}()
	r := <-res
	return r.fd, r.err
}

// setupEvents binds fd, joins the groups of kinds and sizes its buffer.
func setupEvents(fd, bufBytes int, kinds []EventType) error {
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	for _, k := range kinds {
		if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, int(k)); err != nil {
			return fmt.Errorf("join group %d: %w", k, err)
		}
	}
	if bufBytes > 0 {
		// Past net.core.rmem_max (SO_RCVBUFFORCE, with CAP_NET_ADMIN)
		// where it can: SO_RCVBUF alone is capped there, 208 KiB by
		// default, a few hundred events.
		err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bufBytes)
		if err == unix.EPERM {
			err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, bufBytes)
		}
		if err != nil {
			return fmt.Errorf("receive buffer: %w", err)
		}
	}
	return nil
}

// maxBatch bounds the datagrams one Poll reads: 4,096 events, what a
// 4 MiB socket buffer holds.
const maxBatch = 4096

// errClosed is returned by Poll once Close was called.
var errClosed = errors.New("conntrack: events: closed")

// Poll returns the events queued, up to a few thousand, maybe none; it
// never waits. An error wrapping unix.ENOBUFS means events were lost (the
// subscription goes on); other errors end it.
//
// It reads up to 64 datagrams (one per event) per recvmmsg into one
// buffer: netlink.Conn.Receive peeks each datagram's size first and
// allocates per message, which cost about three times the CPU under a
// connection load.
func (e *Events) Poll() ([]Event, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errClosed
	}
	var out []Event
	for got := 0; got < maxBatch; {
		n, err := e.recvmmsg()
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			break
		}
		if err != nil {
			if len(out) > 0 && err == unix.ENOBUFS {
				return out, nil // reported by the next call
			}
			return out, fmt.Errorf("conntrack: events: %w", err)
		}
		for i := 0; i < n; i++ {
			if e.hdrs[i].Hdr.Flags&unix.MSG_TRUNC != 0 {
				continue // larger than a slot: not an event we read
			}
			l := int(e.hdrs[i].Len)
			out = parseDatagram(e.buf[i*slotBytes:i*slotBytes+l], out)
		}
		got += n
		if n < slots {
			break // the queue is drained
		}
	}
	return out, nil
}

// recvmmsg reads up to slots queued datagrams without waiting.
func (e *Events) recvmmsg() (int, error) {
	for i := range e.hdrs {
		e.hdrs[i].Hdr.Flags = 0
	}
	n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(e.fd), uintptr(unsafe.Pointer(&e.hdrs[0])),
		uintptr(len(e.hdrs)), unix.MSG_DONTWAIT, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
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

// Close ends the subscription: Poll then returns an error. It waits for a
// Poll under way. Closing twice does nothing.
func (e *Events) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	return unix.Close(e.fd)
}

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
