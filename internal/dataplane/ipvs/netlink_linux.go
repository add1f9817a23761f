//go:build linux

package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Netlink is the Kernel of the current network namespace, over the IPVS
// generic netlink family (github.com/moby/ipvs). Create it with
// OpenNetlink; it is safe for use by one goroutine at a time.
type Netlink struct {
	h *mobyipvs.Handle
}

var _ Kernel = (*Netlink)(nil)

// ErrNoIPVS is returned by OpenNetlink when the kernel has no IPVS generic
// netlink family (CONFIG_IP_VS off or the ip_vs module not loaded).
var ErrNoIPVS = errors.New("ipvs: the kernel has no IPVS netlink family (ip_vs module missing or CONFIG_IP_VS off)")

// OpenNetlink checks that the kernel has the IPVS generic netlink family and
// opens a handle in the calling thread's network namespace. Without the
// family it returns an error wrapping ErrNoIPVS and never touches
// github.com/moby/ipvs (which would log through logrus and run modprobe).
func OpenNetlink() (*Netlink, error) {
	if _, err := netlink.GenlFamilyGet("IPVS"); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoIPVS, err)
	}
	h, err := mobyipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("ipvs: open netlink handle: %w", err)
	}
	return &Netlink{h: h}, nil
}

// Close releases the netlink socket.
func (n *Netlink) Close() { n.h.Close() }

func mapErr(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EEXIST):
		return fmt.Errorf("ipvs: %s: %w (%v)", op, ErrExist, err)
	case errors.Is(err, unix.ESRCH), errors.Is(err, unix.ENOENT):
		return fmt.Errorf("ipvs: %s: %w (%v)", op, ErrNotFound, err)
	}
	return fmt.Errorf("ipvs: %s: %w", op, err)
}

func protoNum(p model.Protocol) uint16 {
	switch p {
	case model.UDP:
		return unix.IPPROTO_UDP
	case model.SCTP:
		return unix.IPPROTO_SCTP
	}
	return unix.IPPROTO_TCP
}

func protoName(n uint16) model.Protocol {
	switch n {
	case unix.IPPROTO_UDP:
		return model.UDP
	case unix.IPPROTO_SCTP:
		return model.SCTP
	case unix.IPPROTO_TCP:
		return model.TCP
	}
	return model.Protocol(fmt.Sprint(n))
}

func toMobyKey(k ServiceKey) *mobyipvs.Service {
	s := &mobyipvs.Service{
		Address:       net.IP(k.Addr.AsSlice()),
		Port:          k.Port,
		Protocol:      protoNum(k.Protocol),
		AddressFamily: unix.AF_INET,
		Netmask:       0xffffffff,
	}
	if k.Addr.Is6() {
		s.AddressFamily, s.Netmask = unix.AF_INET6, 128
	}
	return s
}

func toMoby(vs VirtualServer) *mobyipvs.Service {
	s := toMobyKey(vs.ServiceKey)
	s.SchedName = vs.Scheduler
	s.Flags = vs.Flags &^ FlagHashed
	s.Timeout = vs.Timeout
	return s
}

func toMobyDest(rs RealServer) *mobyipvs.Destination {
	d := &mobyipvs.Destination{
		Address:         net.IP(rs.Addr.AsSlice()),
		Port:            rs.Port,
		Weight:          rs.Weight,
		ConnectionFlags: mobyipvs.ConnectionFlagMasq,
		AddressFamily:   unix.AF_INET,
	}
	if rs.Addr.Is6() {
		d.AddressFamily = unix.AF_INET6
	}
	return d
}

// Services implements Kernel. Firewall-mark services are skipped.
func (n *Netlink) Services() ([]VirtualServer, error) {
	ss, err := n.h.GetServices()
	if err != nil {
		return nil, mapErr("list services", err)
	}
	out := make([]VirtualServer, 0, len(ss))
	for _, s := range ss {
		if s.FWMark != 0 {
			continue
		}
		a, ok := netip.AddrFromSlice(s.Address)
		if !ok {
			continue
		}
		out = append(out, VirtualServer{
			ServiceKey: ServiceKey{Addr: a.Unmap(), Port: s.Port, Protocol: protoName(s.Protocol)},
			Scheduler:  s.SchedName, Flags: s.Flags, Timeout: s.Timeout,
		})
	}
	return out, nil
}

// AddService implements Kernel.
func (n *Netlink) AddService(vs VirtualServer) error {
	return mapErr("add service "+vs.String(), n.h.NewService(toMoby(vs)))
}

// UpdateService implements Kernel.
func (n *Netlink) UpdateService(vs VirtualServer) error {
	return mapErr("update service "+vs.String(), n.h.UpdateService(toMoby(vs)))
}

// DelService implements Kernel.
func (n *Netlink) DelService(k ServiceKey) error {
	return mapErr("delete service "+k.String(), n.h.DelService(toMobyKey(k)))
}

// Destinations implements Kernel.
func (n *Netlink) Destinations(k ServiceKey) ([]RealServer, error) {
	ds, err := n.h.GetDestinations(toMobyKey(k))
	if err != nil {
		return nil, mapErr("list destinations of "+k.String(), err)
	}
	out := make([]RealServer, 0, len(ds))
	for _, d := range ds {
		a, ok := netip.AddrFromSlice(d.Address)
		if !ok {
			continue
		}
		out = append(out, RealServer{Addr: a.Unmap(), Port: d.Port, Weight: d.Weight,
			ActiveConn: d.ActiveConnections, InactiveConn: d.InactiveConnections})
	}
	return out, nil
}

// AddDest implements Kernel.
func (n *Netlink) AddDest(k ServiceKey, rs RealServer) error {
	return mapErr("add destination "+rs.String()+" to "+k.String(), n.h.NewDestination(toMobyKey(k), toMobyDest(rs)))
}

// UpdateDest implements Kernel.
func (n *Netlink) UpdateDest(k ServiceKey, rs RealServer) error {
	return mapErr("update destination "+rs.String()+" of "+k.String(), n.h.UpdateDestination(toMobyKey(k), toMobyDest(rs)))
}

// DelDest implements Kernel.
func (n *Netlink) DelDest(k ServiceKey, rs RealServer) error {
	return mapErr("delete destination "+rs.String()+" of "+k.String(), n.h.DelDestination(toMobyKey(k), toMobyDest(rs)))
}

// SetTimeouts implements Kernel.
func (n *Netlink) SetTimeouts(t Timeouts) error {
	return mapErr("set timeouts", n.h.SetConfig(&mobyipvs.Config{TimeoutTCP: t.TCP, TimeoutTCPFin: t.TCPFin, TimeoutUDP: t.UDP}))
}
