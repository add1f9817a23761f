//go:build linux

package userspace

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/nfcount"
)

// GuardTable is the nftables table NFTGuard owns (family inet).
const GuardTable = "vipproxy-guard"

// NFTGuard is the Linux Guard: an inet nftables table GuardTable whose
// input chain (priority filter-10) rejects, for new flows only, TCP (with
// a reset), UDP and SCTP to a guarded VIP on a port no listener serves.
// Replies to the node's own connections to a VIP (which leave from the
// VIP) are established flows and pass. It runs the nft command; the zero
// value is ready.
type NFTGuard struct {
	// NFT is the nft binary; "" means "nft" from PATH.
	NFT string
}

func (g NFTGuard) bin() string {
	if g.NFT == "" {
		return "nft"
	}
	return g.NFT
}

// Check implements Guard: nft must be in PATH.
func (g NFTGuard) Check() error {
	if _, err := exec.LookPath(g.bin()); err != nil {
		return fmt.Errorf("no nft to guard VIP addresses: %w", err)
	}
	return nil
}

// Set implements Guard with one atomic nft transaction that replaces the
// table.
func (g NFTGuard) Set(ctx context.Context, vips []netip.Addr, served []GuardPort) error {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s\ndelete table inet %s\ntable inet %s {\n", GuardTable, GuardTable, GuardTable)
	for _, fam := range []struct {
		v6         bool
		ip, suffix string
	}{{false, "ip", "4"}, {true, "ip6", "6"}} {
		typ := "ipv4_addr"
		if fam.v6 {
			typ = "ipv6_addr"
		}
		var addrs, ports []string
		for _, a := range vips {
			if a.Is6() == fam.v6 {
				addrs = append(addrs, a.String())
			}
		}
		for _, p := range served {
			if p.Addr.Addr().Is6() == fam.v6 {
				ports = append(ports, p.Addr.Addr().String()+" . "+strings.ToLower(string(p.Proto))+" . "+strconv.Itoa(int(p.Addr.Port())))
			}
		}
		fmt.Fprintf(&b, "\tset vips%s {\n\t\ttype %s\n%s\t}\n", fam.suffix, typ, elements(addrs))
		fmt.Fprintf(&b, "\tset served%s {\n\t\ttype %s . inet_proto . inet_service\n%s\t}\n", fam.suffix, typ, elements(ports))
	}
	b.WriteString("\tchain input {\n\t\ttype filter hook input priority filter - 10; policy accept;\n")
	b.WriteString("\t\tct state new ip daddr @vips4 meta l4proto { tcp, udp, sctp } ip daddr . meta l4proto . th dport != @served4 jump refuse\n")
	b.WriteString("\t\tct state new ip6 daddr @vips6 meta l4proto { tcp, udp, sctp } ip6 daddr . meta l4proto . th dport != @served6 jump refuse\n")
	b.WriteString("\t}\n\tchain refuse {\n\t\tmeta l4proto tcp reject with tcp reset\n\t\treject\n\t}\n}\n")
	return g.run(ctx, b.String())
}

func elements(list []string) string {
	if len(list) == 0 {
		return ""
	}
	return "\t\telements = { " + strings.Join(list, ", ") + " }\n"
}

// Verify implements Guard: it counts the table's rules and set elements
// over netlink (no nft process) and compares them with what Set wrote.
func (g NFTGuard) Verify(_ context.Context, vips []netip.Addr, served []GuardPort) error {
	c, err := nfcount.Table(nfcount.Inet, GuardTable, nfcount.Options{Elements: true})
	if err != nil {
		return fmt.Errorf("userspace: verify guard: %w", err)
	}
	want := map[string]int{"vips4": 0, "vips6": 0, "served4": 0, "served6": 0}
	for _, a := range vips {
		want["vips"+famSuffix(a)]++
	}
	for _, p := range served {
		want["served"+famSuffix(p.Addr.Addr())]++
	}
	var diffs []string
	for name, n := range want {
		if got, ok := c.Elems[name]; !c.Sets[name] || !ok || got != n {
			diffs = append(diffs, fmt.Sprintf("guard set %s: %d elements, want %d", name, c.Elems[name], n))
		}
	}
	for chain, n := range map[string]int{"input": 2, "refuse": 2} {
		if c.Rules[chain] != n {
			diffs = append(diffs, fmt.Sprintf("guard chain %s: %d rules, want %d", chain, c.Rules[chain], n))
		}
	}
	return dataplane.DriftError(diffs)
}

func famSuffix(a netip.Addr) string {
	if a.Is6() {
		return "6"
	}
	return "4"
}

// Cleanup implements Guard: it deletes the table if it exists. Without
// nft there is nothing it could have installed.
func (g NFTGuard) Cleanup(ctx context.Context) error {
	if g.Check() != nil {
		return nil
	}
	return g.run(ctx, fmt.Sprintf("table inet %s\ndelete table inet %s\n", GuardTable, GuardTable))
}

func (g NFTGuard) run(ctx context.Context, script string) error {
	cmd := exec.CommandContext(ctx, g.bin(), "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("userspace: guard table %s: %w: %s", GuardTable, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// osGuard returns the system's Guard: NFTGuard.
func osGuard() Guard { return NFTGuard{} }

const guardTableName = GuardTable
