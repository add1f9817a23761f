// Package ipset runs ipset(8): the Runner boundary (restore scripts and
// set listing), the real binary (Exec), an in-memory Fake for tests, and
// Destroy, which waits out the kernel's grace period after the rules
// matching a set were deleted. The IPVS mode keeps its dispatch in sets;
// the iptables mode its hairpin masquerade.
package ipset

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// MaxElem is the maxelem vipproxy creates its sets with. ipset's default,
// 65,536, is less than the endpoints of 10,000 Services × 10 (an add past
// it fails: "Hash is full"); the bound costs no memory, a hash grows with
// its members. A set's maxelem is part of its identity for "create
// -exist", so it is one constant.
const MaxElem = 1 << 24

// Runner is the ipset boundary: `ipset restore` scripts
// and set listing. Implementations: Exec and Fake.
type Runner interface {
	// Restore runs an `ipset restore` script (create, add, del, flush,
	// swap, destroy lines). A failing line fails the call; lines before
	// it may have been applied (ipset restore is not one transaction), so
	// callers write full contents through a temporary set and swap.
	Restore(ctx context.Context, script []byte) error
	// List returns the names of all sets (`ipset list -n`).
	List(ctx context.Context) ([]string, error)
}

// Exec runs the ipset binary. The zero value runs it in the current
// network namespace.
type Exec struct {
	// Prefix is prepended to the command line, e.g.
	// []string{"ip", "netns", "exec", "ns1"}.
	Prefix []string
}

func (e *Exec) cmd(ctx context.Context, args ...string) *exec.Cmd {
	all := append(append([]string(nil), e.Prefix...), append([]string{"ipset"}, args...)...)
	return exec.CommandContext(ctx, all[0], all[1:]...)
}

// Restore implements Runner.
func (e *Exec) Restore(ctx context.Context, script []byte) error {
	c := e.cmd(ctx, "restore")
	c.Stdin = bytes.NewReader(script)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	if err := c.Run(); err != nil {
		return fmt.Errorf("ipset restore: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// List implements Runner.
func (e *Exec) List(ctx context.Context) ([]string, error) {
	c := e.cmd(ctx, "list", "-n")
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		return nil, fmt.Errorf("ipset list -n: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.Fields(string(out)), nil
}

// Counter is implemented by Runners that can count a set's members
// without listing them (`ipset list -t`): a drift check's question.
type Counter interface {
	// Count returns the number of members of set name; ok is false when
	// there is no such set.
	Count(ctx context.Context, name string) (n int, ok bool, err error)
}

// Count implements Counter.
func (e *Exec) Count(ctx context.Context, name string) (int, bool, error) {
	c := e.cmd(ctx, "list", "-t", name)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		if strings.Contains(stderr.String(), "does not exist") {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("ipset list -t %s: %w: %s", name, err, strings.TrimSpace(stderr.String()))
	}
	return parseCount(name, string(out))
}

// parseCount reads the "Number of entries" line of `ipset list -t`.
func parseCount(name, out string) (int, bool, error) {
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "Number of entries: "); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return 0, false, fmt.Errorf("ipset list -t %s: %q: %w", name, l, err)
			}
			return n, true, nil
		}
	}
	return 0, false, fmt.Errorf("ipset list -t %s: no \"Number of entries\" line", name)
}
