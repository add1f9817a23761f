package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Family is an IP family: which of iptables and ip6tables a call uses.
type Family int

// The families vipproxy programs.
const (
	IPv4 Family = iota
	IPv6
)

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
	// DeleteNFTTable deletes the nftables table `family name` ("ip" or
	// "ip6"). It succeeds when the table does not exist or when nft is
	// not installed.
	DeleteNFTTable(ctx context.Context, fam Family, name string) error
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

// DeleteNFTTable implements Runner.
func (e *Exec) DeleteNFTTable(ctx context.Context, fam Family, name string) error {
	if len(e.Prefix) == 0 {
		if _, err := exec.LookPath("nft"); err != nil {
			return nil
		}
	}
	f := "ip"
	if fam == IPv6 {
		f = "ip6"
	}
	_, err := e.run(e.cmd(ctx, "nft", "delete", "table", f, name), nil)
	if err != nil && (strings.Contains(err.Error(), "No such file or directory") || strings.Contains(err.Error(), "executable file not found")) {
		return nil
	}
	return err
}
