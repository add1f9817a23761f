//go:build linux

package conntrack

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipproxy/vipproxy/internal/model"
)

// NetlinkTable is the kernel's conntrack table, reached over netlink
// (NETLINK_NETFILTER). It needs CAP_NET_ADMIN. Linux only: on other
// systems the constructors return errors.ErrUnsupported.
type NetlinkTable struct {
	h *netlink.Handle
}

var _ Table = (*NetlinkTable)(nil)

// NewNetlinkTable opens the conntrack table of the caller's network
// namespace.
func NewNetlinkTable() (*NetlinkTable, error) {
	h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("conntrack: open netlink: %w", err)
	}
	return &NetlinkTable{h: h}, nil
}

// NewNetlinkTableAt opens the conntrack table of network namespace ns
// (see netns.GetFromName). The namespace handle may be closed afterwards.
func NewNetlinkTableAt(ns netns.NsHandle) (*NetlinkTable, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("conntrack: open netlink in netns: %w", err)
	}
	return &NetlinkTable{h: h}, nil
}

// Close releases the netlink socket.
func (t *NetlinkTable) Close() { t.h.Close() }

func inetFamily(f model.AddressType) (netlink.InetFamily, error) {
	switch f {
	case model.IPv4:
		return unix.AF_INET, nil
	case model.IPv6:
		return unix.AF_INET6, nil
	}
	return 0, fmt.Errorf("conntrack: unknown address family %q", f)
}

// List implements Table.
func (t *NetlinkTable) List(family model.AddressType) ([]Flow, error) {
	fam, err := inetFamily(family)
	if err != nil {
		return nil, err
	}
	raw, err := t.h.ConntrackTableList(netlink.ConntrackTable, fam)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("conntrack: list %s: %w", family, err)
	}
	// An interrupted dump is still usable for a level-triggered cleanup:
	// whatever it missed is caught by the next round.
	flows := make([]Flow, 0, len(raw))
	for _, c := range raw {
		flows = append(flows, fromNetlink(family, c))
	}
	return flows, nil
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

func fromNetlink(family model.AddressType, c *netlink.ConntrackFlow) Flow {
	f := Flow{
		Family:   family,
		Protocol: c.Forward.Protocol,
		OrigSrc:  addrPort(c.Forward.SrcIP, c.Forward.SrcPort),
		OrigDst:  addrPort(c.Forward.DstIP, c.Forward.DstPort),
		ReplySrc: addrPort(c.Reverse.SrcIP, c.Reverse.SrcPort),
		ReplyDst: addrPort(c.Reverse.DstIP, c.Reverse.DstPort),
		Zone:     c.Zone,
	}
	if tcp, ok := c.ProtoInfo.(*netlink.ProtoInfoTCP); ok {
		f.TCPState = tcp.State
	}
	return f
}

// flowFilter matches kernel entries equal to one of a set of Flows.
type flowFilter struct {
	family model.AddressType
	set    map[Flow]struct{}
}

func (f flowFilter) MatchConntrackFlow(c *netlink.ConntrackFlow) bool {
	fl := fromNetlink(f.family, c)
	fl.TCPState = 0
	_, ok := f.set[fl]
	return ok
}

// Delete implements Table. It dumps each family's table once and deletes
// the entries equal (all Flow fields) to one of flows.
func (t *NetlinkTable) Delete(flows []Flow) (int, error) {
	byFamily := map[model.AddressType]map[Flow]struct{}{}
	for _, f := range flows {
		if byFamily[f.Family] == nil {
			byFamily[f.Family] = map[Flow]struct{}{}
		}
		f.TCPState = 0
		byFamily[f.Family][f] = struct{}{}
	}
	total := 0
	var errs []error
	for _, family := range []model.AddressType{model.IPv4, model.IPv6} {
		set := byFamily[family]
		if len(set) == 0 {
			continue
		}
		delete(byFamily, family)
		fam, _ := inetFamily(family)
		n, err := t.h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, flowFilter{family, set})
		total += int(n)
		if err != nil {
			errs = append(errs, fmt.Errorf("conntrack: delete %s: %w", family, err))
		}
	}
	for family := range byFamily {
		errs = append(errs, fmt.Errorf("conntrack: unknown address family %q", family))
	}
	return total, errors.Join(errs...)
}
