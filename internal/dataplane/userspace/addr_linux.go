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
	"golang.org/x/sys/unix"

	"github.com/vipproxy/vipproxy/internal/dataplane/vipaddr"
)

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

// marked is the vipaddr binding of m's addresses.
func (m LoAddrs) marked() vipaddr.Marked {
	return vipaddr.Marked{Interface: m.ifname(), Label: m.label(), Proto: AddrProto}
}

// Add implements AddrManager. Adding an address that is already there is
// not an error.
func (m LoAddrs) Add(ip netip.Addr) error {
	ip = ip.Unmap()
	if err := m.marked().Add(ip); err != nil {
		return err
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
func (m LoAddrs) Del(ip netip.Addr) error { return m.marked().Del(ip) }

// List implements AddrManager: the addresses on the interface marked as
// vipproxy's (by IFA_PROTO, or for IPv4 by label). A missing interface
// means none.
func (m LoAddrs) List() ([]netip.Addr, error) { return m.marked().List() }
