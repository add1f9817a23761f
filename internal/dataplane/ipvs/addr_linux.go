//go:build linux

package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// DummyName is the dummy interface the IPVS mode creates for its VIPs
// where the kernel has dummy interfaces (kube-proxy calls its kube-ipvs0).
const DummyName = "vipproxy-ipvs0"

// LoLabel is the IPv4 label of the VIPs bound to lo when there are no
// dummy interfaces; AddrProto (IFA_PROTO) marks them in both families.
const (
	LoLabel   = "lo:vipipvs"
	AddrProto = 0x57
)

// ifaProto is the IFA_PROTO attribute (Linux 6.0+), missing from x/sys.
const ifaProto = 11

// LinkAddrs is the Addrs of the calling thread's network namespace. Its
// first Add decides where VIPs go: onto the dummy interface DummyName
// (created, or found from an earlier run), or, when the kernel cannot
// create dummy interfaces, onto lo, marked with LoLabel and AddrProto so
// that List and Cleanup see and touch only vipproxy's addresses. The zero
// value is ready.
type LinkAddrs struct {
	// NoDummy skips the dummy interface and uses lo.
	NoDummy bool
	ifname  string
}

var _ Addrs = (*LinkAddrs)(nil)

// iface returns the interface in use, deciding it on the first call.
func (l *LinkAddrs) iface() (string, error) {
	if l.ifname != "" {
		return l.ifname, nil
	}
	if _, err := netlink.LinkByName(DummyName); err == nil {
		l.ifname = DummyName
		return l.ifname, nil
	}
	if !l.NoDummy {
		err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: DummyName}})
		if err == nil {
			l.ifname = DummyName
			return l.ifname, nil
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOTSUP) {
			return "", fmt.Errorf("ipvs: create dummy interface %s: %w", DummyName, err)
		}
	}
	l.ifname = "lo"
	return l.ifname, nil
}

// Interface returns the interface VIPs are bound to ("" before the first
// Add or List).
func (l *LinkAddrs) Interface() string { return l.ifname }

func (l *LinkAddrs) request(typ, flags int, ip netip.Addr) (*nl.NetlinkRequest, error) {
	name, err := l.iface()
	if err != nil {
		return nil, err
	}
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, fmt.Errorf("ipvs: interface %s: %w", name, err)
	}
	req := nl.NewNetlinkRequest(typ, flags|unix.NLM_F_ACK)
	fam, bits := unix.AF_INET, 32
	if ip.Is6() {
		fam, bits = unix.AF_INET6, 128
	}
	msg := nl.NewIfAddrmsg(fam)
	msg.Index = uint32(ifi.Index)
	msg.Prefixlen = uint8(bits)
	req.AddData(msg)
	b := ip.AsSlice()
	req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, b))
	req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, b))
	return req, nil
}

// Add implements Addrs.
func (l *LinkAddrs) Add(ip netip.Addr) error {
	ip = ip.Unmap()
	req, err := l.request(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, ip)
	if err != nil {
		return fmt.Errorf("ipvs: bind %s: %w", ip, err)
	}
	if ip.Is4() {
		label := LoLabel
		if l.ifname != "lo" {
			label = l.ifname
		}
		req.AddData(nl.NewRtAttr(unix.IFA_LABEL, nl.ZeroTerminated(label)))
	} else {
		flags := make([]byte, 4)
		nl.NativeEndian().PutUint32(flags, unix.IFA_F_NODAD)
		req.AddData(nl.NewRtAttr(unix.IFA_FLAGS, flags))
	}
	req.AddData(nl.NewRtAttr(ifaProto, []byte{AddrProto}))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("ipvs: bind %s to %s: %w", ip, l.ifname, err)
	}
	return nil
}

// Del implements Addrs.
func (l *LinkAddrs) Del(ip netip.Addr) error {
	ip = ip.Unmap()
	req, err := l.request(unix.RTM_DELADDR, 0, ip)
	if err != nil {
		return fmt.Errorf("ipvs: unbind %s: %w", ip, err)
	}
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("ipvs: unbind %s from %s: %w", ip, l.ifname, err)
	}
	return nil
}

// List implements Addrs: every address of the dummy interface, or the
// marked addresses of lo.
func (l *LinkAddrs) List() ([]netip.Addr, error) {
	var out []netip.Addr
	for _, name := range []string{DummyName, "lo"} {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			continue
		}
		req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
		req.AddData(nl.NewIfAddrmsg(unix.AF_UNSPEC))
		msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWADDR)
		if err != nil && !errors.Is(err, nl.ErrDumpInterrupted) {
			return nil, fmt.Errorf("ipvs: list addresses of %s: %w", name, err)
		}
		for _, b := range msgs {
			msg := nl.DeserializeIfAddrmsg(b)
			if int(msg.Index) != ifi.Index {
				continue
			}
			attrs, err := nl.ParseRouteAttr(b[msg.Len():])
			if err != nil {
				return nil, fmt.Errorf("ipvs: list addresses of %s: %w", name, err)
			}
			var addr netip.Addr
			ours := name == DummyName
			for _, a := range attrs {
				switch a.Attr.Type {
				case unix.IFA_LOCAL, unix.IFA_ADDRESS:
					if v, ok := netip.AddrFromSlice(a.Value); ok {
						addr = v
					}
				case unix.IFA_LABEL:
					ours = ours || strings.TrimRight(string(a.Value), "\x00") == LoLabel
				case ifaProto:
					ours = ours || (len(a.Value) == 1 && a.Value[0] == AddrProto)
				}
			}
			if ours && addr.IsValid() && !addr.IsLinkLocalUnicast() {
				out = append(out, addr.Unmap())
			}
		}
	}
	return out, nil
}

// Cleanup implements Addrs: it deletes the dummy interface (with its
// addresses) and the marked addresses of lo.
func (l *LinkAddrs) Cleanup() error {
	var errs []error
	if link, err := netlink.LinkByName(DummyName); err == nil {
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: delete %s: %w", DummyName, err))
		}
	}
	addrs, err := l.List()
	if err != nil {
		errs = append(errs, err)
	}
	saved := l.ifname
	l.ifname = "lo"
	for _, a := range addrs {
		if err := l.Del(a); err != nil {
			errs = append(errs, err)
		}
	}
	l.ifname = saved
	if saved == DummyName {
		l.ifname = ""
	}
	return errors.Join(errs...)
}
