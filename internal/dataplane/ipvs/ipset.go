package ipvs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"
)

// IPSet is the ipset boundary of the IPVS mode: `ipset restore` scripts
// and set listing. Implementations: IPSetExec and FakeIPSet.
type IPSet interface {
	// Restore runs an `ipset restore` script (create, add, del, flush,
	// swap, destroy lines). A failing line fails the call; lines before
	// it may have been applied (ipset restore is not one transaction), so
	// callers write full contents through a temporary set and swap.
	Restore(ctx context.Context, script []byte) error
	// List returns the names of all sets (`ipset list -n`).
	List(ctx context.Context) ([]string, error)
}

// IPSetExec runs the ipset binary. The zero value runs it in the current
// network namespace.
type IPSetExec struct {
	// Prefix is prepended to the command line, e.g.
	// []string{"ip", "netns", "exec", "ns1"}.
	Prefix []string
}

func (e *IPSetExec) cmd(ctx context.Context, args ...string) *exec.Cmd {
	all := append(append([]string(nil), e.Prefix...), append([]string{"ipset"}, args...)...)
	return exec.CommandContext(ctx, all[0], all[1:]...)
}

// Restore implements IPSet.
func (e *IPSetExec) Restore(ctx context.Context, script []byte) error {
	c := e.cmd(ctx, "restore")
	c.Stdin = bytes.NewReader(script)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	if err := c.Run(); err != nil {
		return fmt.Errorf("ipset restore: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// List implements IPSet.
func (e *IPSetExec) List(ctx context.Context) ([]string, error) {
	c := e.cmd(ctx, "list", "-n")
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		return nil, fmt.Errorf("ipset list -n: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.Fields(string(out)), nil
}

// FakeIPSet is an in-memory IPSet. It understands the lines vipproxy
// writes (create NAME TYPE [opts] [-exist], add/del NAME MEMBER [-exist],
// flush, swap, destroy), rejects what ipset would reject (unknown set,
// duplicate create without -exist, swap of sets of different types,
// destroying an unknown set), applies a script line by line like ipset,
// records scripts and dumps its state. The zero value is usable.
type FakeIPSet struct {
	mu      sync.Mutex
	sets    map[string]*fakeSet
	scripts []string
	// Fail, when set, makes Restore return its result before applying.
	Fail func(script string) error
}

type fakeSet struct {
	typ     string // "hash:ip,port family inet"
	members map[string]bool
}

var _ IPSet = (*FakeIPSet)(nil)

// Restore implements IPSet.
func (f *FakeIPSet) Restore(_ context.Context, script []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Fail != nil {
		if err := f.Fail(string(script)); err != nil {
			return err
		}
	}
	f.scripts = append(f.scripts, string(script))
	if f.sets == nil {
		f.sets = map[string]*fakeSet{}
	}
	sc := bufio.NewScanner(bytes.NewReader(script))
	n := 0
	for sc.Scan() {
		n++
		w := strings.Fields(sc.Text())
		if len(w) == 0 {
			continue
		}
		exist := w[len(w)-1] == "-exist"
		if exist {
			w = w[:len(w)-1]
		}
		if err := f.apply(w, exist); err != nil {
			return fmt.Errorf("ipset restore: line %d %q: %w", n, sc.Text(), err)
		}
	}
	return nil
}

func (f *FakeIPSet) apply(w []string, exist bool) error {
	if len(w) < 2 {
		return fmt.Errorf("too few words")
	}
	name := w[1]
	s := f.sets[name]
	switch w[0] {
	case "create":
		typ := strings.Join(w[2:], " ")
		if s != nil {
			if !exist {
				return fmt.Errorf("set %s already exists", name)
			}
			if s.typ != typ {
				return fmt.Errorf("set %s exists with another type", name)
			}
			return nil
		}
		f.sets[name] = &fakeSet{typ: typ, members: map[string]bool{}}
	case "add", "del":
		if s == nil {
			return fmt.Errorf("set %s does not exist", name)
		}
		if len(w) != 3 {
			return fmt.Errorf("want one member")
		}
		if w[0] == "add" {
			if s.members[w[2]] && !exist {
				return fmt.Errorf("element %s already in %s", w[2], name)
			}
			s.members[w[2]] = true
		} else {
			if !s.members[w[2]] && !exist {
				return fmt.Errorf("element %s not in %s", w[2], name)
			}
			delete(s.members, w[2])
		}
	case "flush":
		if s == nil {
			return fmt.Errorf("set %s does not exist", name)
		}
		s.members = map[string]bool{}
	case "swap":
		o := f.sets[w[2]]
		if s == nil || o == nil {
			return fmt.Errorf("swap of missing set")
		}
		if s.typ != o.typ {
			return fmt.Errorf("swap of sets of different types")
		}
		f.sets[name], f.sets[w[2]] = o, s
	case "destroy":
		if s == nil {
			return fmt.Errorf("set %s does not exist", name)
		}
		delete(f.sets, name)
	default:
		return fmt.Errorf("unknown command %s", w[0])
	}
	return nil
}

// List implements IPSet.
func (f *FakeIPSet) List(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.sets {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// Members returns the sorted members of a set, or nil when it is missing.
func (f *FakeIPSet) Members(name string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sets[name]
	if s == nil {
		return nil
	}
	out := []string{}
	for m := range s.members {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// Scripts returns the scripts restored since the last call and forgets them.
func (f *FakeIPSet) Scripts() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.scripts
	f.scripts = nil
	return s
}

// Dump returns every set with its type and sorted members, one per line.
func (f *FakeIPSet) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.sets))
	for n := range f.sets {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		s := f.sets[n]
		ms := make([]string, 0, len(s.members))
		for m := range s.members {
			ms = append(ms, m)
		}
		slices.Sort(ms)
		fmt.Fprintf(&b, "%s %s: %s\n", n, s.typ, strings.Join(ms, " "))
	}
	return b.String()
}

// setInUseRetry is how long destroyKubeProxySets keeps retrying a set the
// kernel still holds, and setInUsePause the pause between tries.
var setInUseRetry, setInUsePause = 15 * time.Second, 250 * time.Millisecond

// destroyKubeProxySets destroys kube-proxy's ipsets (KUBE-*) and returns
// their names and how long it waited for the kernel to let go of them.
// A set is "in use by a kernel component" while a rule matches it, so the
// caller removes kube-proxy's chains first (all of them: its ipvs mode's
// KUBE-IPVS-FILTER matches five sets); and nf_tables frees deleted rules
// after an RCU grace period, asynchronously, so right after the chains
// go, destroying may still fail for a moment. That one failure is
// retried for up to setInUseRetry.
func destroyKubeProxySets(ctx context.Context, set IPSet) ([]string, time.Duration, error) {
	names, err := set.List(ctx)
	if err != nil {
		// No ipset here (not installed, no kernel support): kube-proxy's
		// IPVS mode cannot have left sets either.
		return nil, 0, nil
	}
	script, kube := destroyKube(names)
	if len(kube) == 0 {
		return nil, 0, nil
	}
	start := time.Now()
	deadline := start.Add(setInUseRetry)
	for {
		err = set.Restore(ctx, []byte(script))
		if err == nil || !strings.Contains(err.Error(), "in use") || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, time.Since(start), fmt.Errorf("ipvs: destroy kube-proxy's ipsets: %w", errors.Join(err, ctx.Err()))
		case <-time.After(setInUsePause):
		}
		// A try may have destroyed the sets before the one in use.
		if names, lerr := set.List(ctx); lerr == nil {
			var left []string
			if script, left = destroyKube(names); len(left) == 0 {
				return kube, time.Since(start), nil
			}
		}
	}
	if err != nil {
		return nil, time.Since(start), fmt.Errorf("ipvs: destroy kube-proxy's ipsets: %w", err)
	}
	return kube, time.Since(start), nil
}

// destroyKube returns the ipset restore script destroying kube-proxy's
// sets (KUBE-*) among names, and their names.
func destroyKube(names []string) (script string, kube []string) {
	var b strings.Builder
	for _, n := range names {
		if strings.HasPrefix(n, "KUBE-") {
			b.WriteString("destroy " + n + "\n")
			kube = append(kube, n)
		}
	}
	return b.String(), kube
}
