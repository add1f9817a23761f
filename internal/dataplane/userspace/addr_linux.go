//go:build linux

package userspace

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ifaProto is the IFA_PROTO attribute (Linux 6.0+), missing from x/sys.
const ifaProto = 11

// LoAddrs owns VIP addresses on the loopback interface over netlink: each
// VIP is a /32 or /128 address on lo, marked as vipproxy's with the
// address protocol AddrProto (IFA_PROTO, both families) and, for IPv4, the
// label "lo:vipproxy" (which `ip addr` shows). List and Del only ever see
// or touch addresses so marked. The zero value uses "lo".
type LoAddrs struct {
	// Interface is the interface to add addresses to; "" means "lo".
	Interface string
}

// AddrProto is the IFA_PROTO value that marks vipproxy's addresses.
const AddrProto = 0x56 // 'V'

// Label is the IPv4 address label of vipproxy's addresses on lo.
const Label = "lo:vipproxy"

func (m LoAddrs) ifname() string {
	if m.Interface == "" {
		return "lo"
	}
	return m.Interface
}

func (m LoAddrs) label() string {
	if m.Interface == "" || m.Interface == "lo" {
		return Label
	}
	return m.Interface + ":vipproxy"
}

// osAddrs returns the address manager for this system: LoAddrs.
func osAddrs() AddrManager { return LoAddrs{} }

// CanAdd implements AddrManager: it reports an error unless the process
// has CAP_NET_ADMIN and the interface exists.
func (m LoAddrs) CanAdd() error {
	if _, err := net.InterfaceByName(m.ifname()); err != nil {
		return fmt.Errorf("interface %s: %w", m.ifname(), err)
	}
	ok, err := hasNetAdmin()
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("no CAP_NET_ADMIN to add addresses to " + m.ifname())
	}
	return nil
}

// hasNetAdmin reads CapEff from /proc/self/status.
func hasNetAdmin() (bool, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return false, fmt.Errorf("read capabilities: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return false, fmt.Errorf("parse CapEff %q: %w", v, err)
			}
			return caps&(1<<unix.CAP_NET_ADMIN) != 0, nil
		}
	}
	return false, errors.New("read capabilities: no CapEff in /proc/self/status")
}

func (m LoAddrs) index() (int, error) {
	ifi, err := net.InterfaceByName(m.ifname())
	if err != nil {
		return 0, fmt.Errorf("interface %s: %w", m.ifname(), err)
	}
	return ifi.Index, nil
}

func (m LoAddrs) request(typ int, flags int, ip netip.Addr) (*nl.NetlinkRequest, error) {
	idx, err := m.index()
	if err != nil {
		return nil, err
	}
	req := nl.NewNetlinkRequest(typ, flags|unix.NLM_F_ACK)
	fam, bits := unix.AF_INET, 32
	if ip.Is6() {
		fam, bits = unix.AF_INET6, 128
	}
	msg := nl.NewIfAddrmsg(fam)
	msg.Index = uint32(idx)
	msg.Prefixlen = uint8(bits)
	req.AddData(msg)
	b := ip.AsSlice()
	req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, b))
	req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, b))
	return req, nil
}

// Add implements AddrManager. Adding an address that is already there is
// not an error.
func (m LoAddrs) Add(ip netip.Addr) error {
	ip = ip.Unmap()
	req, err := m.request(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, ip)
	if err != nil {
		return fmt.Errorf("add %s to %s: %w", ip, m.ifname(), err)
	}
	if ip.Is4() {
		req.AddData(nl.NewRtAttr(unix.IFA_LABEL, nl.ZeroTerminated(m.label())))
	} else {
		flags := make([]byte, 4)
		nl.NativeEndian().PutUint32(flags, unix.IFA_F_NODAD)
		req.AddData(nl.NewRtAttr(unix.IFA_FLAGS, flags))
	}
	req.AddData(nl.NewRtAttr(ifaProto, []byte{AddrProto}))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add %s to %s: %w", ip, m.ifname(), err)
	}
	if ip.Is6() {
		waitLocal(ip)
	}
	return nil
}

// waitLocal waits up to a second for the kernel to route ip locally. An
// IPv6 address can be bound at once, but its local route is installed by
// the kernel's addrconf work queue a little later; until then connections
// to it fail with "network is unreachable".
func waitLocal(ip netip.Addr) {
	for range 100 {
		// Before the route exists the lookup fails (ENETUNREACH) or finds
		// a non-local route; both mean "not yet".
		routes, err := netlink.RouteGet(ip.AsSlice())
		if err == nil && len(routes) > 0 && routes[0].Type == unix.RTN_LOCAL {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Del implements AddrManager. Deleting an address that is not there is not
// an error.
func (m LoAddrs) Del(ip netip.Addr) error {
	ip = ip.Unmap()
	req, err := m.request(unix.RTM_DELADDR, 0, ip)
	if err != nil {
		return fmt.Errorf("delete %s from %s: %w", ip, m.ifname(), err)
	}
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete %s from %s: %w", ip, m.ifname(), err)
	}
	return nil
}

// List implements AddrManager: the addresses on the interface marked as
// vipproxy's (by IFA_PROTO, or for IPv4 by label). A missing interface
// means none.
func (m LoAddrs) List() ([]netip.Addr, error) {
	ifi, err := net.InterfaceByName(m.ifname())
	if err != nil {
		return nil, nil
	}
	req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
	req.AddData(nl.NewIfAddrmsg(unix.AF_UNSPEC))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWADDR)
	if err != nil && !errors.Is(err, nl.ErrDumpInterrupted) {
		return nil, fmt.Errorf("list addresses of %s: %w", m.ifname(), err)
	}
	var out []netip.Addr
	for _, b := range msgs {
		msg := nl.DeserializeIfAddrmsg(b)
		if int(msg.Index) != ifi.Index {
			continue
		}
		attrs, err := nl.ParseRouteAttr(b[msg.Len():])
		if err != nil {
			return nil, fmt.Errorf("list addresses of %s: %w", m.ifname(), err)
		}
		var (
			local, addr netip.Addr
			ours        bool
		)
		for _, a := range attrs {
			switch a.Attr.Type {
			case unix.IFA_LOCAL:
				local, _ = netip.AddrFromSlice(a.Value)
			case unix.IFA_ADDRESS:
				addr, _ = netip.AddrFromSlice(a.Value)
			case unix.IFA_LABEL:
				ours = ours || strings.TrimRight(string(a.Value), "\x00") == m.label()
			case ifaProto:
				ours = ours || (len(a.Value) == 1 && a.Value[0] == AddrProto)
			}
		}
		if !ours {
			continue
		}
		if local.IsValid() {
			addr = local
		}
		if addr.IsValid() {
			out = append(out, addr.Unmap())
		}
	}
	return out, nil
}
