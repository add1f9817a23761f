//go:build linux

package ipset

import (
	"context"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Edit implements Editor over netlink, in the namespace Prefix names
// ("ip netns exec NAME") or the current one: no process per call.
func (e *Exec) Edit(_ context.Context, set string, add, del []Entry) error {
	h, err := e.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	for _, op := range []struct {
		entries []Entry
		f       func(string, *netlink.IPSetEntry) error
		name    string
	}{{add, h.IpsetAdd, "add"}, {del, h.IpsetDel, "del"}} {
		for _, en := range op.entries {
			port, proto := en.Port, en.Proto
			ne := &netlink.IPSetEntry{IP: net.IP(en.IP.AsSlice()), Port: &port, Protocol: &proto, Replace: true}
			if en.IP2.IsValid() {
				ne.IP2 = net.IP(en.IP2.AsSlice())
			}
			if err := op.f(set, ne); err != nil {
				return fmt.Errorf("ipset: %s %s %s: %w", op.name, set, en, err)
			}
		}
	}
	return nil
}

func (e *Exec) handle() (*netlink.Handle, error) {
	if len(e.Prefix) == 4 && e.Prefix[0] == "ip" && e.Prefix[1] == "netns" && e.Prefix[2] == "exec" {
		ns, err := netns.GetFromName(e.Prefix[3])
		if err != nil {
			return nil, fmt.Errorf("ipset: namespace %s: %w", e.Prefix[3], err)
		}
		defer ns.Close()
		return netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	}
	if len(e.Prefix) > 0 {
		return nil, fmt.Errorf("ipset: netlink in the namespace of %q is not supported", e.Prefix)
	}
	return netlink.NewHandle(unix.NETLINK_NETFILTER)
}
