package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Family is an IP family: which of iptables and ip6tables a call uses.
type Family int

// The families vipproxy programs.
const (
	IPv4 Family = iota
	IPv6
)

// metricLabel is the family as kube-proxy's ip_family label spells it.
func (f Family) metricLabel() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

func (f Family) String() string {
	if f == IPv6 {
		return "ipv6"
	}
	return "ipv4"
}

// The tables vipproxy writes.
const (
	TableNAT    = "nat"
	TableFilter = "filter"
)

// Runner is the OS boundary of the iptables mode: it runs
// iptables-restore, iptables-save and single-chain listings. Every call
// names the family (iptables or ip6tables) and one table.
type Runner interface {
	// Restore feeds data to `iptables-restore --noflush` for one table.
	// The kernel applies the whole input or nothing (one transaction per
	// table); on error nothing of data is in force.
	Restore(ctx context.Context, fam Family, table string, data []byte) error
	// Save returns `iptables-save -t table` output.
	Save(ctx context.Context, fam Family, table string) ([]byte, error)
	// ListChain returns `iptables -t table -S chain` output. A missing
	// chain (or table) yields an error for which IsNotFound is true.
	ListChain(ctx context.Context, fam Family, table, chain string) ([]byte, error)
}

// NotFoundError reports a chain or table that does not exist.
type NotFoundError struct {
	Table, Chain string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("iptables: chain %s in table %s not found", e.Chain, e.Table)
}

// IsNotFound reports whether err (or an error it wraps) is a NotFoundError.
func IsNotFound(err error) bool {
	var nf *NotFoundError
	return errors.As(err, &nf)
}

// Exec is the Runner that runs the real binaries. The zero value runs
// them in the current network namespace with a 5 second lock wait.
type Exec struct {
	// Prefix is prepended to every command line, e.g.
	// []string{"ip", "netns", "exec", "ns1"}. Empty runs the binaries directly.
	Prefix []string
	// Env holds extra environment variables (e.g. XTABLES_LOCKFILE=...).
	Env []string
	// LockWait is how long iptables waits for the xtables lock (-w);
	// zero means 5 seconds. (iptables-nft ignores the lock; the legacy
	// variant honours it.)
	LockWait time.Duration
	// Variant selects the binaries: "" runs iptables, iptables-restore…
	// (whatever the system links them to); "legacy" or "nft" run
	// iptables-legacy-restore… or iptables-nft-restore….
	Variant string

	mu  sync.Mutex
	nft map[Family]bool // IsNFT results
}

// netns returns the network namespace Prefix runs the binaries in, when
// Prefix is `ip netns exec NAME`, else "" (the caller's).
func (e *Exec) netns() string {
	if len(e.Prefix) == 4 && e.Prefix[0] == "ip" && e.Prefix[1] == "netns" && e.Prefix[2] == "exec" {
		return e.Prefix[3]
	}
	return ""
}

// IsNFT reports whether the binaries of fam use the nf_tables backend:
// true for Variant "nft", false for "legacy", otherwise what
// `iptables -V` says (asked once per family; true when it fails).
func (e *Exec) IsNFT(ctx context.Context, fam Family) bool {
	switch e.Variant {
	case "nft":
		return true
	case "legacy":
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if v, ok := e.nft[fam]; ok {
		return v
	}
	out, err := e.run(e.cmd(ctx, e.bin(fam, "tables"), "-V"), nil)
	if err != nil {
		return true
	}
	v := strings.Contains(string(out), "nf_tables")
	if e.nft == nil {
		e.nft = map[Family]bool{}
	}
	e.nft[fam] = v
	return v
}

func (e *Exec) bin(fam Family, name string) string {
	// name is "tables", "tables-save" or "tables-restore".
	if e.Variant != "" {
		if i := strings.IndexByte(name, '-'); i >= 0 {
			name = name[:i] + "-" + e.Variant + name[i:]
		} else {
			name += "-" + e.Variant
		}
	}
	if fam == IPv6 {
		return "ip6" + name
	}
	return "ip" + name
}

func (e *Exec) wait() string {
	w := e.LockWait
	if w <= 0 {
		w = 5 * time.Second
	}
	return strconv.Itoa(int((w + time.Second - 1) / time.Second))
}

func (e *Exec) cmd(ctx context.Context, args ...string) *exec.Cmd {
	all := append(append([]string(nil), e.Prefix...), args...)
	c := exec.CommandContext(ctx, all[0], all[1:]...)
	if len(e.Env) > 0 {
		c.Env = append(c.Environ(), e.Env...)
	}
	return c
}

func (e *Exec) run(c *exec.Cmd, stdin []byte) ([]byte, error) {
	var out, errb bytes.Buffer
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s: %w: %s", strings.Join(c.Args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// Restore implements Runner.
func (e *Exec) Restore(ctx context.Context, fam Family, table string, data []byte) error {
	_, err := e.run(e.cmd(ctx, e.bin(fam, "tables-restore"), "--noflush", "-w", e.wait()), data)
	return err
}

// Save implements Runner.
func (e *Exec) Save(ctx context.Context, fam Family, table string) ([]byte, error) {
	return e.run(e.cmd(ctx, e.bin(fam, "tables-save"), "-t", table), nil)
}

// ListChain implements Runner.
func (e *Exec) ListChain(ctx context.Context, fam Family, table, chain string) ([]byte, error) {
	c := e.cmd(ctx, e.bin(fam, "tables"), "-w", e.wait(), "-t", table, "-S", chain)
	out, err := e.run(c, nil)
	if err != nil {
		var ee *exec.ExitError
		// iptables-legacy says "No chain/target/match by that name";
		// iptables-nft 1.8.9 says the missing chain "is incompatible".
		msg := err.Error()
		if errors.As(err, &ee) && (strings.Contains(msg, "No chain/target/match") ||
			strings.Contains(msg, "is incompatible") || strings.Contains(msg, "does not exist")) {
			return nil, &NotFoundError{Table: table, Chain: chain}
		}
		return nil, err
	}
	return out, nil
}

// emptyPruner is implemented by Runners that can remove what Cleanup
// leaves behind: iptables-nft creates nftables tables and base chains on
// first use, and removing vipproxy's chains leaves them empty.
type emptyPruner interface {
	PruneEmpty(ctx context.Context, fam Family, table string) (bool, error)
}

// PruneEmpty removes, from the nftables table behind an iptables-nft
// table, every built-in chain that is empty with policy accept, and the
// table itself when nothing else is left (no rules, other chains, sets or
// maps). Such chains let every packet through, so removing them changes
// nothing. With iptables-legacy it does nothing. It reports whether it
// removed anything.
func (e *Exec) PruneEmpty(ctx context.Context, fam Family, table string) (bool, error) {
	v, err := e.run(e.cmd(ctx, e.bin(fam, "tables"), "-V"), nil)
	if err != nil || !strings.Contains(string(v), "nf_tables") {
		return false, nil
	}
	f := "ip"
	if fam == IPv6 {
		f = "ip6"
	}
	out, err := e.run(e.cmd(ctx, "nft", "list", "table", f, table), nil)
	if err != nil {
		if strings.Contains(err.Error(), "No such file or directory") || strings.Contains(err.Error(), "executable file not found") {
			return false, nil
		}
		return false, err
	}
	empty, tableEmpty := emptyBaseChains(string(out), table)
	var args []string
	switch {
	case tableEmpty:
		args = []string{"nft", "delete", "table", f, table}
	case len(empty) > 0:
		var b strings.Builder
		for _, c := range empty {
			fmt.Fprintf(&b, "delete chain %s %s %s\n", f, table, c)
		}
		args = []string{"nft", "-f", "-"}
		if _, err := e.run(e.cmd(ctx, args...), []byte(b.String())); err != nil {
			return false, err
		}
		return true, nil
	default:
		return false, nil
	}
	if _, err := e.run(e.cmd(ctx, args...), nil); err != nil {
		return false, err
	}
	return true, nil
}

// emptyBaseChains parses `nft list table` output and returns the built-in
// chains of table that are empty with policy accept, and whether the table
// holds nothing else.
func emptyBaseChains(out, table string) (empty []string, tableEmpty bool) {
	tableEmpty = true
	depth := 0
	var cur string
	curOK := false
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case depth == 0 && strings.HasPrefix(l, "table ") && strings.HasSuffix(l, "{"):
			depth = 1
		case depth == 1 && strings.HasPrefix(l, "chain ") && strings.HasSuffix(l, " {"):
			depth = 2
			cur = strings.TrimSuffix(strings.TrimPrefix(l, "chain "), " {")
			curOK = slices.Contains(builtinChains[table], cur)
		case depth == 2 && strings.HasPrefix(l, "type ") && strings.HasSuffix(l, ";"):
			if !strings.HasSuffix(l, "policy accept;") {
				curOK = false
			}
		case l == "}":
			if depth == 2 {
				if curOK {
					empty = append(empty, cur)
				} else {
					tableEmpty = false
				}
			}
			depth--
		case depth == 2:
			curOK = false // a rule
		default:
			tableEmpty = false // a set, map, flowtable, …
			if strings.HasSuffix(l, "{") {
				depth++
			}
		}
	}
	return empty, tableEmpty
}
