//go:build linux

package ipvs

import (
	"errors"
	"net/netip"
	"testing"

	mobyipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"

	"github.com/vipproxy/vipproxy/internal/model"
)

// TestNetlinkConversion checks what the Netlink adapter hands to
// github.com/moby/ipvs (the attributes it serialises): families,
// netmasks, protocol numbers, flags without the kernel's hashed bit,
// persistence timeout and masquerade forwarding. The kernel side of these
// calls was never run here (no IPVS in this kernel).
func TestNetlinkConversion(t *testing.T) {
	cases := []struct {
		name    string
		vs      VirtualServer
		family  uint16
		netmask uint32
		proto   uint16
	}{
		{"ipv4 tcp persistent", VirtualServer{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: model.TCP},
			Scheduler: "sh", Flags: FlagPersistent | FlagHashed, Timeout: 10800}, unix.AF_INET, 0xffffffff, unix.IPPROTO_TCP},
		{"ipv6 udp", VirtualServer{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("fd00:96::10"), Port: 53, Protocol: model.UDP},
			Scheduler: "lc"}, unix.AF_INET6, 128, unix.IPPROTO_UDP},
		{"ipv4 sctp", VirtualServer{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("10.96.0.11"), Port: 3868, Protocol: model.SCTP},
			Scheduler: "nq"}, unix.AF_INET, 0xffffffff, unix.IPPROTO_SCTP},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := toMoby(tc.vs)
			if s.AddressFamily != tc.family || s.Netmask != tc.netmask || s.Protocol != tc.proto || s.Port != tc.vs.Port {
				t.Errorf("service af=%d netmask=%#x proto=%d port=%d", s.AddressFamily, s.Netmask, s.Protocol, s.Port)
			}
			if s.SchedName != tc.vs.Scheduler || s.Timeout != tc.vs.Timeout || s.Flags != tc.vs.Flags&^FlagHashed {
				t.Errorf("service sched=%q timeout=%d flags=%#x", s.SchedName, s.Timeout, s.Flags)
			}
			if a, _ := netip.AddrFromSlice(s.Address); a.Unmap() != tc.vs.Addr {
				t.Errorf("address %v, want %v", s.Address, tc.vs.Addr)
			}
			if protoName(s.Protocol) != tc.vs.Protocol {
				t.Errorf("protoName(%d) = %q", s.Protocol, protoName(s.Protocol))
			}
			d := toMobyDest(RealServer{Addr: tc.vs.Addr, Port: 8080, Weight: 0})
			if d.ConnectionFlags&mobyipvs.ConnectionFlagFwdMask != mobyipvs.ConnectionFlagMasq || d.Weight != 0 || d.AddressFamily != tc.family || d.Port != 8080 {
				t.Errorf("destination %+v", d)
			}
		})
	}
}

func TestNetlinkErrors(t *testing.T) {
	for _, tc := range []struct {
		err             error
		exist, notFound bool
	}{
		{unix.EEXIST, true, false},
		{unix.ESRCH, false, true},
		{unix.ENOENT, false, true},
		{unix.EINVAL, false, false},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			err := mapErr("op", tc.err)
			if IsExist(err) != tc.exist || IsNotFound(err) != tc.notFound {
				t.Errorf("mapErr(%v) = %v: exist %v notFound %v", tc.err, err, IsExist(err), IsNotFound(err))
			}
			if !tc.exist && !tc.notFound && !errors.Is(err, tc.err) {
				t.Errorf("mapErr(%v) = %v does not wrap the errno", tc.err, err)
			}
		})
	}
	if mapErr("op", nil) != nil {
		t.Error("mapErr(nil) != nil")
	}
}
