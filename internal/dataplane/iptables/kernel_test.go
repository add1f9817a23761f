package iptables

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/netnstest"
)

// newNetns creates a network namespace "vpipt-<pid>-<n>" removed when the
// test ends, or skips the test when not root or ip is missing.
func newNetns(t testing.TB) string {
	t.Helper()
	return netnstest.New(t, "vpipt")
}

func nsRun(t testing.TB, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// kernelProxier returns a Proxier programming netns ns with the real
// binaries of variant ("" or "legacy").
func kernelProxier(t testing.TB, ns, variant string, o dataplane.Options, run *Exec) *Proxier {
	t.Helper()
	if run == nil {
		run = &Exec{}
	}
	run.Prefix = []string{"ip", "netns", "exec", ns}
	run.Variant = variant
	bin := "iptables-restore"
	if variant != "" {
		bin = "iptables-" + variant + "-restore"
	}
	if _, err := exec.LookPath(bin); err != nil {
		t.Skipf("needs %s", bin)
	}
	p, err := New(Options{Options: o, Runner: run, Sysctl: netnsSysctl(ns)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ruleShape maps each chain of a table to its rule count, from
// iptables-save output: the kernel reorders match options, so rule text
// cannot be compared, but chains and counts can.
func ruleShape(save []byte) map[string]int {
	st := parseSave(save)
	out := map[string]int{}
	for _, c := range st.chains {
		out[c] = len(st.rules[c])
	}
	return out
}

func kernelShape(t testing.TB, r Runner, fam Family, table string) map[string]int {
	t.Helper()
	out, err := r.Save(ctx, fam, table)
	if err != nil {
		t.Fatal(err)
	}
	return ruleShape(out)
}

// stripSave drops iptables-save's timestamp comment lines.
func stripSave(b []byte) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func saveAll(t testing.TB, r Runner) string {
	t.Helper()
	var b strings.Builder
	for _, fam := range []Family{IPv4, IPv6} {
		for _, table := range []string{TableNAT, TableFilter, "mangle", "raw"} {
			out, err := r.Save(ctx, fam, table)
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString(stripSave(out))
		}
	}
	return b.String()
}

// TestKernel programs every behaviour scenario in turn into a real
// namespace (first full, then partial syncs), checks that the kernel holds
// exactly the chains and rule counts the fake holds, that flushing or
// deleting vipproxy's nat chains is repaired by the next (partial) Sync,
// that jump rules are put back first, and that Cleanup restores
// iptables-save output exactly.
func TestKernel(t *testing.T) {
	for _, variant := range []string{"", "legacy"} {
		t.Run("variant="+variant, func(t *testing.T) {
			ns := newNetns(t)
			run := &Exec{}
			p := kernelProxier(t, ns, variant, dataplanetest.BaseOptions(), run)
			// A user rule that must survive everything.
			nsRun(t, ns, run.bin(IPv4, "tables"), "-t", "nat", "-A", "POSTROUTING", "-s", "192.0.2.0/24", "-j", "RETURN")
			before := saveAll(t, run)
			nftRuleset := func() string {
				if variant != "" {
					return ""
				}
				if _, err := exec.LookPath("nft"); err != nil {
					return ""
				}
				return nsRun(t, ns, "nft", "list", "ruleset")
			}
			nftBefore := nftRuleset()

			fp, f := newFakeProxier(t, dataplanetest.BaseOptions())
			compare := func(step string) {
				t.Helper()
				for _, fam := range []Family{IPv4, IPv6} {
					for _, table := range []string{TableNAT, TableFilter} {
						want := ruleShape([]byte(f.Dump(fam, table)))
						got := kernelShape(t, run, fam, table)
						if fam == IPv4 && table == TableNAT {
							want["POSTROUTING"]++ // the user rule
						}
						for c := range got {
							if !isOurs(c) && got[c] == 0 && want[c] == 0 {
								delete(got, c)
							}
						}
						for c := range want {
							if !isOurs(c) && want[c] == 0 {
								delete(want, c)
							}
						}
						if diff := cmp.Diff(want, got); diff != "" {
							t.Fatalf("%s: %s %s chains/rule counts differ from the fake (-fake +kernel):\n%s", step, fam, table, diff)
						}
					}
					for _, k := range setKinds {
						set := k.name(fam)
						if diff := cmp.Diff(fakeSets(fp).Members(set), kernelSetMembers(t, ns, set)); diff != "" {
							t.Fatalf("%s: %s members differ from the fake (-fake +kernel):\n%s", step, set, diff)
						}
					}
				}
			}
			for i, sc := range dataplanetest.Scenarios() {
				if err := p.Sync(ctx, sc.State(), i == 0); err != nil {
					t.Fatalf("%s: %v", sc.Name, err)
				}
				if err := fp.Sync(ctx, sc.State(), i == 0); err != nil {
					t.Fatal(err)
				}
				compare(sc.Name)
			}
			ipt := run.bin(IPv4, "tables")
			// Flush every chain of nat (builtins included), then a partial Sync.
			nsRun(t, ns, ipt, "-t", "nat", "-F")
			nsRun(t, ns, ipt, "-t", "nat", "-A", "POSTROUTING", "-s", "192.0.2.0/24", "-j", "RETURN")
			if err := p.Sync(ctx, dataplanetest.Scenarios()[len(dataplanetest.Scenarios())-1].State(), false); err != nil {
				t.Fatal(err)
			}
			compare("after nat flush")
			// Flush and delete only vipproxy's nat chains.
			st := parseSave([]byte(nsRun(t, ns, run.bin(IPv4, "tables-save"), "-t", "nat")))
			var del strings.Builder
			del.WriteString("*nat\n")
			for _, c := range []string{"PREROUTING", "OUTPUT", "POSTROUTING"} {
				rules := st.rules[c]
				for i := len(rules) - 1; i >= 0; i-- {
					if isOurs(ruleTarget(rules[i])) {
						fmt.Fprintf(&del, "-D %s %d\n", c, i+1)
					}
				}
			}
			for _, c := range st.chains {
				if isOurs(c) {
					del.WriteString("-F " + c + "\n")
				}
			}
			for _, c := range st.chains {
				if isOurs(c) {
					del.WriteString("-X " + c + "\n")
				}
			}
			del.WriteString("COMMIT\n")
			if err := run.Restore(ctx, IPv4, TableNAT, []byte(del.String())); err != nil {
				t.Fatal(err)
			}
			if sh := kernelShape(t, run, IPv4, TableNAT); sh[chainServices] != 0 || slices.ContainsFunc(mapKeys(sh), isOurs) {
				t.Fatalf("chains not deleted: %v", sh)
			}
			if err := p.Sync(ctx, dataplanetest.Scenarios()[len(dataplanetest.Scenarios())-1].State(), false); err != nil {
				t.Fatal(err)
			}
			compare("after deleting nat chains")
			// Someone puts a rule in front of our jumps.
			nsRun(t, ns, ipt, "-I", "FORWARD", "1", "-j", "ACCEPT")
			if err := p.Sync(ctx, dataplanetest.Scenarios()[len(dataplanetest.Scenarios())-1].State(), true); err != nil {
				t.Fatal(err)
			}
			fwd := parseSave([]byte(nsRun(t, ns, run.bin(IPv4, "tables-save"), "-t", "filter"))).rules["FORWARD"]
			if len(fwd) != 5 || ruleTarget(fwd[0]) != chainFirewall || ruleTarget(fwd[4]) != "ACCEPT" {
				t.Errorf("FORWARD after full sync = %q, want our 4 jumps then the user rule", fwd)
			}
			nsRun(t, ns, ipt, "-D", "FORWARD", "-j", "ACCEPT")
			// A real full sync of an unchanged kernel reads and compares,
			// and writes nothing.
			p.opts.FullSyncInterval = -1
			if err := p.Sync(ctx, dataplanetest.Scenarios()[len(dataplanetest.Scenarios())-1].State(), true); err != nil {
				t.Fatal(err)
			}
			if n := p.LastRestoreBytes(); n != 0 {
				t.Errorf("full sync of an unchanged kernel wrote %d bytes", n)
			}

			if err := p.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(before, saveAll(t, run)); diff != "" {
				t.Errorf("Cleanup did not restore iptables-save output (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(nftBefore, nftRuleset()); diff != "" {
				t.Errorf("Cleanup did not restore the nftables ruleset (-before +after):\n%s", diff)
			}
			if sets := nsRun(t, ns, "ipset", "list", "-n"); strings.Contains(sets, "VIP") {
				t.Errorf("Cleanup left ipsets: %q", sets)
			}
			if err := p.Cleanup(ctx); err != nil {
				t.Errorf("second Cleanup: %v", err)
			}
		})
	}
}

// kernelSetMembers returns the sorted members of an ipset in ns.
func kernelSetMembers(t *testing.T, ns, set string) []string {
	t.Helper()
	out := []string{}
	for _, l := range strings.Split(nsRun(t, ns, "ipset", "save", set), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "add" {
			out = append(out, f[2])
		}
	}
	slices.Sort(out)
	return out
}

func mapKeys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestKernelLock holds the xtables lock (a private XTABLES_LOCKFILE, so no
// other process on the host is affected) from another process while
// syncing with the legacy binaries, which honour the lock (iptables-nft
// ignores it). With a long enough -w the Sync waits and then applies the
// whole ruleset; with a short one it fails and leaves the previous rules
// intact, and the next Sync is full.
func TestKernelLock(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("needs flock")
	}
	ns := newNetns(t)
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	run := &Exec{Env: []string{"XTABLES_LOCKFILE=" + lock}, LockWait: 10 * time.Second}
	o := dataplanetest.BaseOptions()
	p := kernelProxier(t, ns, "legacy", o, run)
	scs := dataplanetest.Scenarios()
	if err := p.Sync(ctx, scs[0].State(), true); err != nil {
		t.Fatal(err)
	}
	hold := func(d time.Duration) {
		t.Helper()
		cmd := exec.Command("flock", lock, "sleep", fmt.Sprint(d.Seconds()))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		// Wait (bounded) until the lock is held.
		for i := 0; i < 50; i++ {
			if exec.Command("flock", "-n", lock, "true").Run() != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatal("lock holder did not take the lock")
	}

	// Long wait: the sync is delayed, then complete.
	hold(3 * time.Second)
	start := time.Now()
	if err := p.Sync(ctx, scs[1].State(), false); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("Sync took %v while the lock was held for 3s; want it to wait", d)
	}
	fp, f := newFakeProxier(t, o)
	if err := fp.Sync(ctx, scs[1].State(), true); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ruleShape([]byte(f.Dump(IPv4, TableNAT))), kernelShape(t, run, IPv4, TableNAT)); diff != "" {
		t.Errorf("ruleset after waiting for the lock differs (-want +got):\n%s", diff)
	}

	// Short wait: the sync fails, nothing changes, the next one is full.
	beforeSave := saveAll(t, &Exec{Prefix: run.Prefix, Variant: "legacy"})
	run.LockWait = time.Second
	hold(4 * time.Second)
	if err := p.Sync(ctx, scs[2].State(), false); err == nil {
		t.Fatal("Sync succeeded although the lock was held longer than -w")
	}
	if diff := cmp.Diff(beforeSave, saveAll(t, &Exec{Prefix: run.Prefix, Variant: "legacy"})); diff != "" {
		t.Errorf("failed Sync changed the ruleset:\n%s", diff)
	}
	run.LockWait = 10 * time.Second
	if err := p.Sync(ctx, scs[2].State(), false); err != nil {
		t.Fatal(err)
	}
	if err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestKernelListChainNotFound checks that Exec recognises a missing chain
// with each variant's error text.
func TestKernelListChainNotFound(t *testing.T) {
	for _, variant := range []string{"", "legacy"} {
		t.Run("variant="+variant, func(t *testing.T) {
			ns := newNetns(t)
			run := &Exec{Prefix: []string{"ip", "netns", "exec", ns}, Variant: variant}
			if _, err := exec.LookPath(run.bin(IPv4, "tables")); err != nil {
				t.Skip(err)
			}
			for _, table := range []string{TableNAT, TableFilter} {
				if _, err := run.ListChain(ctx, IPv4, table, ChainCanary); !IsNotFound(err) {
					t.Errorf("%s: ListChain of a missing chain = %v, want IsNotFound", table, err)
				}
			}
			if err := run.Restore(ctx, IPv6, TableNAT, []byte("*nat\n-N "+ChainCanary+"\n-A "+ChainCanary+" -j RETURN\nCOMMIT\n")); err != nil {
				t.Fatal(err)
			}
			out, err := run.ListChain(ctx, IPv6, TableNAT, ChainCanary)
			if err != nil || !strings.Contains(string(out), "-A "+ChainCanary+" -j RETURN") {
				t.Errorf("ListChain = %q, %v", out, err)
			}
		})
	}
}

// netnsSysctl reads sysctls of a network namespace (read only).
type netnsSysctl string

func (ns netnsSysctl) Read(path string) (string, error) {
	out, err := exec.Command("ip", "netns", "exec", string(ns), "cat", path).Output()
	return strings.TrimSpace(string(out)), err
}

func (netnsSysctl) Write(path, _ string) error { return fmt.Errorf("read only: %s", path) }

// TestKernelHairpinSetLarge fills a real hairpin set past ipset's default
// maxelem (65,536): 7,000 Services × 10 endpoints, iptables in the Fake.
func TestKernelHairpinSetLarge(t *testing.T) {
	ns := newNetns(t)
	if _, err := exec.LookPath("ipset"); err != nil {
		t.Skip("needs ipset")
	}
	p, err := New(Options{Options: dataplanetest.BaseOptions(), Runner: NewFake(), Families: []Family{IPv4},
		IPSet: &ipset.Exec{Prefix: []string{"ip", "netns", "exec", ns}}, Sysctl: netnsSysctl(ns)})
	if err != nil {
		t.Fatal(err)
	}
	st := bigState(7000, 10)
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	if n := len(kernelSetMembers(t, ns, hairpinKind.v4)); n != 70000 {
		t.Fatalf("%d members after the full sync, want 70000", n)
	}
	// A partial sync replaces one Service's 10 endpoints.
	if err := p.Sync(ctx, changeOne(st, 10, 9090), false); err != nil {
		t.Fatal(err)
	}
	m := kernelSetMembers(t, ns, hairpinKind.v4)
	if len(m) != 70000 || !slices.Contains(m, "10.1.0.10,tcp:9090,10.1.0.10") || slices.Contains(m, "10.1.0.10,tcp:8080,10.1.0.10") {
		t.Errorf("after one change: %d members, new endpoint in: %v, old one gone: %v", len(m),
			slices.Contains(m, "10.1.0.10,tcp:9090,10.1.0.10"), !slices.Contains(m, "10.1.0.10,tcp:8080,10.1.0.10"))
	}
}
