package userspace

import (
	"cmp"
	"context"
	"errors"
	"net/netip"
	"slices"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Guard keeps the node's own listeners off the VIP addresses the mode
// owns. A VIP bound on lo is a local address, so without a guard sshd on
// 0.0.0.0:22 or the kubelet on :10250 would answer on VIP:22 and
// VIP:10250 from pods and clients (kube-proxy's bug class #72236).
// Implementations: NFTGuard (Linux) and NoGuard.
type Guard interface {
	// Check returns nil when Set can work, else why not (for the log).
	Check() error
	// Set refuses new connections and datagrams (TCP, UDP, SCTP) to any
	// of vips on a protocol and port not in served; everything else to
	// vips passes. Each call replaces the previous one atomically.
	Set(ctx context.Context, vips []netip.Addr, served []GuardPort) error
	// Cleanup removes what Set installed; nothing installed is not an
	// error.
	Cleanup(ctx context.Context) error
	// Verify returns an error wrapping dataplane.ErrDrift when what the
	// last Set(vips, served) installed is no longer whole in the kernel.
	Verify(ctx context.Context, vips []netip.Addr, served []GuardPort) error
}

// GuardPort is one protocol and address:port a listener serves.
type GuardPort struct {
	Proto model.Protocol
	Addr  netip.AddrPort
}

func compareGuardPort(a, b GuardPort) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	return cmp.Compare(a.Proto, b.Proto)
}

// NoGuard is a Guard that cannot guard: the mode then says at start that
// host listeners answer on VIP addresses. Reason says why.
type NoGuard struct{ Reason string }

// Check implements Guard: always an error carrying Reason.
func (n NoGuard) Check() error {
	if n.Reason == "" {
		return errors.New("no guard configured")
	}
	return errors.New(n.Reason)
}

// Set implements Guard: always the Check error.
func (n NoGuard) Set(context.Context, []netip.Addr, []GuardPort) error { return n.Check() }

// Cleanup implements Guard: nothing to remove.
func (NoGuard) Cleanup(context.Context) error { return nil }

// Verify implements Guard: nothing to check.
func (NoGuard) Verify(context.Context, []netip.Addr, []GuardPort) error { return nil }

// guardState is the last guard content Set, to skip identical calls.
type guardState struct {
	vips   []netip.Addr
	served []GuardPort
	set    bool
	ever   bool // a Set succeeded once
}

// guardContent returns the sorted VIPs to guard and the ports the open
// listeners serve on them.
func guardContent(owned map[netip.Addr]bool, listeners map[listenKey]*listener) ([]netip.Addr, []GuardPort) {
	vips := make([]netip.Addr, 0, len(owned))
	for ip := range owned {
		vips = append(vips, ip)
	}
	slices.SortFunc(vips, netip.Addr.Compare)
	var served []GuardPort
	for k := range listeners {
		if owned[k.addr.Addr()] {
			served = append(served, GuardPort{Proto: k.proto, Addr: k.addr})
		}
	}
	slices.SortFunc(served, compareGuardPort)
	return vips, served
}
