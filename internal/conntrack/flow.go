// Package conntrack removes stale UDP and SCTP conntrack entries after a
// sync, as kube-proxy's conntrack reconciler does.
//
// UDP and SCTP have no connection teardown the dataplane could see: once a
// flow is DNATed to an endpoint, the kernel keeps sending its packets
// there for as long as the flow's conntrack entry lives, even after the
// endpoint is gone or the Service changed. The Reconciler is
// level-triggered: after every successful sync it lists the conntrack
// table and deletes what the desired State no longer justifies (see
// Stale). TCP entries are never touched: TCP flows to a vanished endpoint
// end by themselves (RST or timeout), and deleting them would break live
// connections.
package conntrack

import (
	"fmt"
	"net/netip"

	"github.com/vipproxy/vipproxy/internal/model"
)

// IANA protocol numbers of the protocols Flow.Protocol can hold.
const (
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// Flow is one conntrack entry as far as cleanup cares. For a DNATed
// Service flow, OrigDst is the Service address (VIP:port or node:nodePort)
// and ReplySrc is the endpoint the kernel chose; for a flow that was not
// DNATed, ReplySrc equals OrigDst.
type Flow struct {
	Family   model.AddressType // model.IPv4 or model.IPv6
	Protocol uint8             // IANA number (ProtoUDP, …)
	OrigSrc  netip.AddrPort
	OrigDst  netip.AddrPort
	ReplySrc netip.AddrPort
	ReplyDst netip.AddrPort
	// Zone is the conntrack zone (0 unless zones are used).
	Zone uint16
	// TCPState is a TCP entry's conntrack state (TCPEstablished, …) as
	// List saw it; 0 otherwise. Delete ignores it: an entry is the same
	// entry whatever state it moved to since.
	TCPState uint8
}

// Conntrack TCP states (enum tcp_conntrack) that Live tells apart.
const (
	TCPEstablished uint8 = 3
	TCPTimeWait    uint8 = 7
	TCPClose       uint8 = 8
)

// Live reports whether f is a flow still in use: any UDP or SCTP entry, a
// TCP entry that is not in TIME_WAIT or CLOSE.
func (f Flow) Live() bool {
	return f.Protocol != ProtoTCP || (f.TCPState != TCPTimeWait && f.TCPState != TCPClose)
}

func (f Flow) String() string {
	return fmt.Sprintf("%s proto=%d zone=%d orig %s->%s reply %s->%s",
		f.Family, f.Protocol, f.Zone, f.OrigSrc, f.OrigDst, f.ReplySrc, f.ReplyDst)
}

// protoNumber maps a Service protocol to its IANA number (0 if unknown).
func protoNumber(p model.Protocol) uint8 {
	switch p {
	case model.TCP:
		return ProtoTCP
	case model.UDP:
		return ProtoUDP
	case model.SCTP:
		return ProtoSCTP
	}
	return 0
}

// familyLabel is the ip_family metric label of f ("4" or "6").
func familyLabel(f model.AddressType) string {
	if f == model.IPv6 {
		return "IPv6"
	}
	return "IPv4"
}
