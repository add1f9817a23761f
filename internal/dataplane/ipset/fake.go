package ipset

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Fake is an in-memory ipset.Runner. It understands the lines vipproxy
// writes (create NAME TYPE [opts] [-exist], add/del NAME MEMBER [-exist],
// flush, swap, rename, destroy), rejects what ipset would reject (unknown set,
// duplicate create without -exist, swap of sets of different types,
// destroying an unknown set), applies a script line by line like ipset,
// records scripts and dumps its state. The zero value is usable.
type Fake struct {
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

var (
	_ Runner  = (*Fake)(nil)
	_ Counter = (*Fake)(nil)
	_ Counter = (*Exec)(nil)
)

// Restore implements Runner.
func (f *Fake) Restore(_ context.Context, script []byte) error {
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

func (f *Fake) apply(w []string, exist bool) error {
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
	case "rename":
		if s == nil || len(w) != 3 {
			return fmt.Errorf("rename of missing set %s", name)
		}
		if f.sets[w[2]] != nil {
			return fmt.Errorf("set %s already exists", w[2])
		}
		f.sets[w[2]] = s
		delete(f.sets, name)
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

// List implements Runner.
func (f *Fake) List(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.sets {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// Count implements Counter.
func (f *Fake) Count(_ context.Context, name string) (int, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sets[name]
	if !ok {
		return 0, false, nil
	}
	return len(s.members), true, nil
}

// Members returns the sorted members of a set, or nil when it is missing.
func (f *Fake) Members(name string) []string {
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
func (f *Fake) Scripts() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.scripts
	f.scripts = nil
	return s
}

// Dump returns every set with its type and sorted members, one per line.
func (f *Fake) Dump() string {
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
