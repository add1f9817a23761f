//go:build linux

package vipaddr

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ifaProto is the IFA_PROTO attribute (Linux 6.0+), missing from x/sys.
const ifaProto = 11

func (m Marked) request(typ, flags int, ip netip.Addr) (*nl.NetlinkRequest, error) {
	ifi, err := net.InterfaceByName(m.Interface)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", m.Interface, err)
	}
	req := nl.NewNetlinkRequest(typ, flags|unix.NLM_F_ACK)
	fam := unix.AF_INET
	if ip.Is6() {
		fam = unix.AF_INET6
	}
	msg := nl.NewIfAddrmsg(fam)
	msg.Index = uint32(ifi.Index)
	msg.Prefixlen = uint8(Host(ip))
	req.AddData(msg)
	b := ip.AsSlice()
	req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, b))
	req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, b))
	return req, nil
}

// Add binds ip, marked; an address already there is not an error. IPv6
// addresses skip duplicate address detection.
func (m Marked) Add(ip netip.Addr) error {
	ip = ip.Unmap()
	req, err := m.request(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, ip)
	if err != nil {
		return fmt.Errorf("add %s to %s: %w", ip, m.Interface, err)
	}
	if ip.Is4() && m.Label != "" {
		req.AddData(nl.NewRtAttr(unix.IFA_LABEL, nl.ZeroTerminated(m.Label)))
	}
	if ip.Is6() {
		flags := make([]byte, 4)
		nl.NativeEndian().PutUint32(flags, unix.IFA_F_NODAD)
		req.AddData(nl.NewRtAttr(unix.IFA_FLAGS, flags))
	}
	req.AddData(nl.NewRtAttr(ifaProto, []byte{m.Proto}))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add %s to %s: %w", ip, m.Interface, err)
	}
	return nil
}

// Del unbinds ip; an address that is not there is not an error.
func (m Marked) Del(ip netip.Addr) error {
	ip = ip.Unmap()
	req, err := m.request(unix.RTM_DELADDR, 0, ip)
	if err != nil {
		return fmt.Errorf("delete %s from %s: %w", ip, m.Interface, err)
	}
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete %s from %s: %w", ip, m.Interface, err)
	}
	return nil
}

// List returns the marked addresses of the interface (every one with
// All), link-local ones excepted; a missing interface has none.
func (m Marked) List() ([]netip.Addr, error) {
	ifi, err := net.InterfaceByName(m.Interface)
	if err != nil {
		return nil, nil
	}
	req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
	req.AddData(nl.NewIfAddrmsg(unix.AF_UNSPEC))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWADDR)
	if err != nil && !errors.Is(err, nl.ErrDumpInterrupted) {
		return nil, fmt.Errorf("list addresses of %s: %w", m.Interface, err)
	}
	var out []netip.Addr
	for _, b := range msgs {
		msg := nl.DeserializeIfAddrmsg(b)
		if int(msg.Index) != ifi.Index {
			continue
		}
		attrs, err := nl.ParseRouteAttr(b[msg.Len():])
		if err != nil {
			return nil, fmt.Errorf("list addresses of %s: %w", m.Interface, err)
		}
		var local, addr netip.Addr
		ours := m.All
		for _, a := range attrs {
			switch a.Attr.Type {
			case unix.IFA_LOCAL:
				local, _ = netip.AddrFromSlice(a.Value)
			case unix.IFA_ADDRESS:
				addr, _ = netip.AddrFromSlice(a.Value)
			case unix.IFA_LABEL:
				ours = ours || (m.Label != "" && strings.TrimRight(string(a.Value), "\x00") == m.Label)
			case ifaProto:
				ours = ours || (len(a.Value) == 1 && a.Value[0] == m.Proto)
			}
		}
		if local.IsValid() {
			addr = local
		}
		if ours && addr.IsValid() && !addr.IsLinkLocalUnicast() {
			out = append(out, addr.Unmap())
		}
	}
	return out, nil
}
