// Package dataplanetest is the backend-agnostic behaviour suite every
// dataplane's fake must pass. A backend supplies a Tracer that walks its
// (fake) ruleset for one packet and reports what would happen to it; the
// suite programs States through the backend's Sync and asserts verdicts for
// every semantic rule (DESIGN.md, "Semantics to get right"), so behaviour
// tests survive rule-layout refactors.
package dataplanetest

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Packet is the first packet of a new connection as a tracer sees it.
type Packet struct {
	Src, Dst netip.Addr
	Proto    model.Protocol
	DstPort  uint16
	// FromLocalNode is true when a process on the node sent the packet
	// (netfilter output hook; Src is then one of the node's addresses).
	// False means it arrived from outside the node's network stack (a pod
	// on the node or another host; prerouting hook).
	FromLocalNode bool
	// DstLocal is true when Dst is an address of the node (what
	// `fib daddr type local` / `-m addrtype --dst-type LOCAL` match).
	// RunBehaviour fills it from Env; tracers only read it.
	DstLocal bool
}

func (p Packet) String() string {
	from := "remote"
	if p.FromLocalNode {
		from = "node"
	}
	return fmt.Sprintf("%s %s -> %s (%s)", p.Proto, p.Src, netip.AddrPortFrom(p.Dst, p.DstPort), from)
}

// Action is what the dataplane does with a packet.
type Action int

// The actions a Tracer reports.
const (
	// Accept: the packet is not Service traffic; the dataplane leaves it alone.
	Accept Action = iota
	// DNAT: the packet is sent to one of Verdict.Targets.
	DNAT
	// Drop: silently dropped.
	Drop
	// Reject: refused (TCP RST or ICMP/ICMPv6 port unreachable).
	Reject
)

func (a Action) String() string {
	switch a {
	case Accept:
		return "accept"
	case DNAT:
		return "dnat"
	case Drop:
		return "drop"
	case Reject:
		return "reject"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Target is one endpoint a DNAT may choose, and whether the packet is
// masqueraded (source NAT to the node) when that endpoint is chosen.
type Target struct {
	Endpoint   netip.AddrPort
	Masquerade bool
}

func (t Target) String() string {
	if t.Masquerade {
		return t.Endpoint.String() + "+masq"
	}
	return t.Endpoint.String()
}

// Verdict is what happens to a Packet.
type Verdict struct {
	Action Action
	// Targets lists every endpoint a (random) choice may pick, for DNAT
	// only. Order does not matter; Normalize sorts it.
	Targets []Target
	// AffinitySeconds is the ClientIP session-affinity timeout applied to
	// the connection, 0 when there is no affinity.
	AffinitySeconds int
}

// Normalize sorts Targets by endpoint and returns v.
func (v Verdict) Normalize() Verdict {
	v.Targets = slices.Clone(v.Targets)
	slices.SortFunc(v.Targets, func(a, b Target) int { return a.Endpoint.Compare(b.Endpoint) })
	if len(v.Targets) == 0 {
		v.Targets = nil
	}
	return v
}

func (v Verdict) String() string {
	var b strings.Builder
	b.WriteString(v.Action.String())
	if len(v.Targets) > 0 {
		b.WriteString(" [")
		for i, t := range v.Normalize().Targets {
			if i > 0 {
				b.WriteString(" ")
			}
			b.WriteString(t.String())
		}
		b.WriteString("]")
	}
	if v.AffinitySeconds > 0 {
		fmt.Fprintf(&b, " affinity=%ds", v.AffinitySeconds)
	}
	return b.String()
}

// Tracer walks a backend's programmed ruleset for one packet. It must read
// what the backend actually programmed (a fake's state), not the State.
type Tracer interface {
	Trace(p Packet) Verdict
}

// TracerFunc adapts a function to Tracer.
type TracerFunc func(p Packet) Verdict

// Trace calls f(p).
func (f TracerFunc) Trace(p Packet) Verdict { return f(p) }
