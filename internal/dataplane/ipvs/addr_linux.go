//go:build linux

package ipvs

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipproxy/vipproxy/internal/dataplane/vipaddr"
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

// marked is the vipaddr binding of the interface in use.
func (l *LinkAddrs) marked() (vipaddr.Marked, error) {
	name, err := l.iface()
	if err != nil {
		return vipaddr.Marked{}, err
	}
	label := LoLabel
	if name != "lo" {
		label = name
	}
	return vipaddr.Marked{Interface: name, Label: label, Proto: AddrProto}, nil
}

// Add implements Addrs.
func (l *LinkAddrs) Add(ip netip.Addr) error {
	m, err := l.marked()
	if err == nil {
		err = m.Add(ip)
	}
	if err != nil {
		return fmt.Errorf("ipvs: bind %s: %w", ip, err)
	}
	return nil
}

// Del implements Addrs.
func (l *LinkAddrs) Del(ip netip.Addr) error {
	m, err := l.marked()
	if err == nil {
		err = m.Del(ip)
	}
	if err != nil {
		return fmt.Errorf("ipvs: unbind %s: %w", ip, err)
	}
	return nil
}

// List implements Addrs: every address of the dummy interface, or the
// marked addresses of lo.
func (l *LinkAddrs) List() ([]netip.Addr, error) {
	var out []netip.Addr
	for _, name := range []string{DummyName, "lo"} {
		got, err := vipaddr.Marked{Interface: name, Label: LoLabel, Proto: AddrProto, All: name == DummyName}.List()
		if err != nil {
			return nil, fmt.Errorf("ipvs: %w", err)
		}
		out = append(out, got...)
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
