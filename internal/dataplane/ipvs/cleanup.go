package ipvs

// What the mode removes: everything it installed (Cleanup), and the drift
// check that asks for a full sync when its rules were removed.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os/exec"
	"slices"
	"strings"

	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
)

// emptyPruner is the optional iptables.Runner method that deletes a
// table's built-in chains when no rule is left in them (iptables.Exec on
type emptyPruner interface {
	PruneEmpty(ctx context.Context, fam iptables.Family, table string) (bool, error)
}

// rulesGone returns why the last full sync's iptables rules are no longer
// in place (a chain is missing in some family, e.g. after iptables -F/-X
// or a firewall reload), or "" when they are. It lists one chain per
// family; an error other than "not found" counts as present (the periodic
// full sync repairs the rest).
func (p *Proxier) rulesGone(ctx context.Context) string {
	for _, fam := range p.opts.Families {
		if _, err := p.opts.Runner.ListChain(ctx, fam, iptables.TableFilter, chainFilter); iptables.IsNotFound(err) {
			return fmt.Sprintf("%s chain %s missing", fam, chainFilter)
		}
	}
	return ""
}

// Cleanup implements dataplane.Dataplane. It deletes the virtual servers
// on vipproxy's VIPs, on NodeIPs, those it made, and with FlushLocal
// those on every local address, except those in ExcludeCIDRs; unbinds the VIPs (and
// deletes the dummy interface); removes the VIPVS- iptables chains and the
// jumps to them; destroys the VIPVS-/VIPVS6- ipsets; and puts back the
// sysctls this Proxier changed. It succeeds when there is nothing to remove.
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return cleanup(ctx, &p.opts, p.applied, p.originals)
}

func cleanup(ctx context.Context, o *Options, applied map[ServiceKey]*appliedVS, originals map[string]string) error {
	var errs []error
	if o.Kernel != nil {
		errs = append(errs, cleanupServers(o, applied)...)
	}
	if err := o.Addrs.Cleanup(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, cleanupRules(ctx, o)...)
	errs = append(errs, cleanupSets(ctx, o)...)
	for _, name := range slices.Sorted(maps.Keys(originals)) {
		if err := o.Sysctl.Write(name, originals[name]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanupServers deletes the virtual servers on the addresses the mode
// owns: its bound VIPs, the node IPs, those it made (applied) and, with
// FlushLocal, every local address; never one inside ExcludeCIDRs.
func cleanupServers(o *Options, applied map[ServiceKey]*appliedVS) []error {
	var errs []error
	owned := map[netip.Addr]bool{}
	if addrs, err := o.Addrs.List(); err == nil {
		for _, a := range addrs {
			owned[a] = true
		}
	} else {
		errs = append(errs, err)
	}
	for _, a := range o.NodeIPs {
		owned[a] = true
	}
	if o.FlushLocal {
		if local, err := o.LocalAddrs(); err == nil {
			for _, a := range local {
				owned[a] = true
			}
		}
	}
	for k := range applied {
		owned[k.Addr] = true
	}
	svcs, err := o.Kernel.Services()
	if err != nil {
		errs = append(errs, err)
	}
	for _, vs := range svcs {
		if !owned[vs.Addr] || slices.ContainsFunc(o.ExcludeCIDRs, func(c netip.Prefix) bool { return c.Contains(vs.Addr) }) {
			continue
		}
		if err := o.Kernel.DelService(vs.ServiceKey); err != nil && !IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errs
}

// cleanupRules removes every VIPVS- chain and the jumps to them, and the
// tables iptables-nft made for them when they are left empty.
func cleanupRules(ctx context.Context, o *Options) []error {
	var errs []error
	for _, fam := range o.Families {
		for _, table := range tables {
			// iptables-save of a table another mode filled with 10,000s of
			// rules takes seconds; skip tables where none of our chains is.
			if !anyChain(ctx, o.Runner, fam, table, ownChains[table]) {
				continue
			}
			saved, err := o.Runner.Save(ctx, fam, table)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if in := cleanupInput(table, saved); in != nil {
				if err := o.Runner.Restore(ctx, fam, table, in); err != nil {
					errs = append(errs, err)
					continue
				}
			}
			// iptables-nft created the table and its built-in chains for
			// our rules; left empty, they go too (as in iptables mode), so
			// the nftables ruleset is as before vipproxy ran.
			if d, ok := o.Runner.(emptyPruner); ok {
				if _, err := d.PruneEmpty(ctx, fam, table); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errs
}

// cleanupSets destroys every VIPVS- and VIPVS6- ipset.
func cleanupSets(ctx context.Context, o *Options) []error {
	names, err := o.IPSet.List(ctx)
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) { // no ipset binary: no sets
			return nil
		}
		return []error{err}
	}
	var b strings.Builder
	for _, n := range names {
		if strings.HasPrefix(n, SetPrefix) || strings.HasPrefix(n, SetPrefix6) {
			b.WriteString("destroy " + n + "\n")
		}
	}
	if b.Len() > 0 {
		if err := o.IPSet.Restore(ctx, []byte(b.String())); err != nil {
			return []error{err}
		}
	}
	return nil
}

// anyChain reports whether one of chains exists in table (an error other
// than "not found" counts as existing, so the caller looks closer).
func anyChain(ctx context.Context, r iptables.Runner, fam iptables.Family, table string, chains []string) bool {
	for _, c := range chains {
		if _, err := r.ListChain(ctx, fam, table, c); err == nil || !iptables.IsNotFound(err) {
			return true
		}
	}
	return false
}
