package iptables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// builtinChains lists each table's built-in chains in iptables-save order.
var builtinChains = map[string][]string{
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"raw":    {"PREROUTING", "OUTPUT"},
}

// builtinTargets are -j targets that are not chains.
var builtinTargets = map[string]bool{
	"ACCEPT": true, "DROP": true, "RETURN": true, "REJECT": true, "DNAT": true, "SNAT": true,
	"MASQUERADE": true, "MARK": true, "LOG": true, "REDIRECT": true, "CONNMARK": true, "NOTRACK": true, "CT": true,
}

// FakeChain is one chain of a Fake table. Rules hold each rule's
// arguments after "-A <chain>", unquoted.
type FakeChain struct {
	Name    string
	Builtin bool
	Rules   [][]string
}

// FakeTable is one table of a Fake.
type FakeTable struct {
	Chains map[string]*FakeChain
}

func newFakeTable(name string) *FakeTable {
	t := &FakeTable{Chains: map[string]*FakeChain{}}
	for _, c := range builtinChains[name] {
		t.Chains[c] = &FakeChain{Name: c, Builtin: true}
	}
	return t
}

// shallow copies the chain map only; chains are copied when written.
func (t *FakeTable) shallow() *FakeTable {
	return &FakeTable{Chains: maps.Clone(t.Chains)}
}

func (t *FakeTable) clone() *FakeTable {
	n := &FakeTable{Chains: make(map[string]*FakeChain, len(t.Chains))}
	for k, c := range t.Chains {
		cc := *c
		cc.Rules = slices.Clone(c.Rules)
		n.Chains[k] = &cc
	}
	return n
}

// Fake is an in-memory Runner. It parses iptables-restore input with
// --noflush semantics (chain declarations flush, -A/-I/-D/-X/-F/-N), applies
// each table's input atomically, rejects what the kernel would reject
// (unknown chains and jump targets, deleting chains that are not empty or
// still referenced, deleting rules that do not exist), and dumps its state
// as iptables-save text. It is safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	tables map[Family]map[string]*FakeTable

	// FailRestore, when set, is called before each Restore; a non-nil
	// result fails that Restore without changing anything.
	FailRestore func(fam Family, table string, data []byte) error
	// Restores records every Restore input that succeeded, in order.
	Restores []FakeRestore
	// Counts of calls by kind ("restore", "save", "list", "prune").
	Calls map[string]int
}

// FakeRestore is one recorded Restore call.
type FakeRestore struct {
	Family Family
	Table  string
	Data   string
}

// NewFake returns a Fake with empty filter, nat, mangle and raw tables in
// both families.
func NewFake() *Fake {
	f := &Fake{tables: map[Family]map[string]*FakeTable{}, Calls: map[string]int{}}
	for _, fam := range []Family{IPv4, IPv6} {
		f.tables[fam] = map[string]*FakeTable{}
		for name := range builtinChains {
			f.tables[fam][name] = newFakeTable(name)
		}
	}
	return f
}

// Table returns a copy of one table, or nil.
func (f *Fake) Table(fam Family, table string) *FakeTable {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[fam][table]
	if t == nil {
		return nil
	}
	return t.clone()
}

// Restore implements Runner.
func (f *Fake) Restore(_ context.Context, fam Family, table string, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls["restore"]++
	if f.FailRestore != nil {
		if err := f.FailRestore(fam, table, data); err != nil {
			return err
		}
	}
	tx := &fakeTx{tables: f.tables[fam], work: map[string]*FakeTable{}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if err := tx.line(line); err != nil {
			return fmt.Errorf("iptables-restore (fake): line %d failed: %w: %s", n, err, line)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("iptables-restore (fake): %w", err)
	}
	if tx.cur != "" {
		return fmt.Errorf("iptables-restore (fake): table %s not committed", tx.cur)
	}
	for name, t := range tx.work {
		f.tables[fam][name] = t
	}
	f.Restores = append(f.Restores, FakeRestore{Family: fam, Table: table, Data: string(data)})
	return nil
}

// fakeTx is one Restore of a Fake: working copies of the tables it
// touches, committed only when every line applied.
type fakeTx struct {
	tables map[string]*FakeTable // the committed tables of the family
	work   map[string]*FakeTable
	cur    string // the table between *table and COMMIT
	// owned marks chains of the working table already copied in this
	// transaction (copy on write: the committed table is never modified).
	owned map[string]bool
	// refs counts jumps per target chain, computed at the first -X after
	// a change.
	refs map[string]int
}

// line applies one line of restore input.
func (tx *fakeTx) line(line string) error {
	switch {
	case line[0] == '*':
		if tx.cur != "" {
			return fmt.Errorf("table %s not committed", tx.cur)
		}
		tx.cur = line[1:]
		if tx.tables[tx.cur] == nil {
			return errors.New("unknown table")
		}
		tx.work[tx.cur] = tx.tables[tx.cur].shallow()
		tx.owned, tx.refs = map[string]bool{}, nil
		return nil
	case line == "COMMIT":
		if tx.cur == "" {
			return errors.New("COMMIT outside a table")
		}
		tx.cur = ""
		return nil
	case tx.cur == "":
		return errors.New("no table")
	case line[0] == ':':
		return tx.declare(line[1:])
	}
	args, err := SplitArgs(line)
	if err != nil {
		return err
	}
	if len(args) < 2 {
		return errors.New("bad command")
	}
	return tx.command(args[0], args[1], args[2:])
}

// declare applies ":CHAIN …": a new chain, or a user chain flushed.
func (tx *fakeTx) declare(decl string) error {
	tx.refs = nil
	fields := strings.Fields(decl)
	if len(fields) == 0 {
		return errors.New("empty chain declaration")
	}
	t := tx.work[tx.cur]
	if c := t.Chains[fields[0]]; c == nil || !c.Builtin {
		t.Chains[fields[0]] = &FakeChain{Name: fields[0]}
		tx.owned[fields[0]] = true
	}
	return nil
}

// command applies -A, -I, -D, -F, -N or -X on chain name.
func (tx *fakeTx) command(cmd, name string, rest []string) error {
	t := tx.work[tx.cur]
	if cmd != "-X" {
		tx.refs = nil // jump references may change
	}
	c := t.Chains[name]
	if c != nil && !tx.owned[name] {
		cc := *c
		cc.Rules = slices.Clone(c.Rules)
		c = &cc
		t.Chains[name] = c
		tx.owned[name] = true
	}
	if c == nil && cmd != "-N" {
		return fmt.Errorf("chain %s does not exist", name)
	}
	switch cmd {
	case "-A", "-I":
		return tx.insert(t, c, cmd == "-I", rest)
	case "-D":
		return deleteRule(c, rest)
	case "-F":
		c.Rules = nil
	case "-N":
		if c != nil {
			return errors.New("chain already exists")
		}
		t.Chains[name] = &FakeChain{Name: name}
		tx.owned[name] = true
	case "-X":
		return tx.deleteChain(t, c)
	default:
		return fmt.Errorf("unknown command %s", cmd)
	}
	return nil
}

// insert appends (-A) or inserts (-I [pos]) a rule whose jump target must
// exist.
func (tx *fakeTx) insert(t *FakeTable, c *FakeChain, insert bool, rest []string) error {
	pos := len(c.Rules)
	if insert {
		pos = 0
		if len(rest) > 0 {
			if i, err := strconv.Atoi(rest[0]); err == nil {
				if i < 1 || i > len(c.Rules)+1 {
					return errors.New("index of insertion too big")
				}
				pos, rest = i-1, rest[1:]
			}
		}
	}
	if j := jumpTarget(rest); j != "" && !builtinTargets[j] && t.Chains[j] == nil {
		return fmt.Errorf("couldn't load target %s", j)
	}
	c.Rules = slices.Insert(c.Rules, pos, slices.Clone(rest))
	return nil
}

// deleteRule deletes a rule by position or by its arguments.
func deleteRule(c *FakeChain, rest []string) error {
	if len(rest) == 1 {
		if i, err := strconv.Atoi(rest[0]); err == nil {
			if i < 1 || i > len(c.Rules) {
				return errors.New("index of deletion too big")
			}
			c.Rules = slices.Delete(c.Rules, i-1, i)
			return nil
		}
	}
	i := slices.IndexFunc(c.Rules, func(r []string) bool { return slices.Equal(r, rest) })
	if i < 0 {
		return errors.New("bad rule (does a matching rule exist in that chain?)")
	}
	c.Rules = slices.Delete(c.Rules, i, i+1)
	return nil
}

// deleteChain deletes an empty user chain no rule jumps to.
func (tx *fakeTx) deleteChain(t *FakeTable, c *FakeChain) error {
	if c.Builtin {
		return errors.New("cannot delete built-in chain")
	}
	if len(c.Rules) > 0 {
		return errors.New("directory not empty")
	}
	if tx.refs == nil {
		tx.refs = map[string]int{}
		for _, o := range t.Chains {
			for _, r := range o.Rules {
				tx.refs[jumpTarget(r)]++
			}
		}
	}
	if tx.refs[c.Name] > 0 {
		return fmt.Errorf("too many links (chain %s is referenced)", c.Name)
	}
	delete(t.Chains, c.Name)
	return nil
}

// jumpTarget returns the -j argument of a rule, or "".
func jumpTarget(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-j" || args[i] == "--jump" {
			return args[i+1]
		}
	}
	return ""
}

// Save implements Runner.
func (f *Fake) Save(_ context.Context, fam Family, table string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls["save"]++
	t := f.tables[fam][table]
	if t == nil {
		return nil, fmt.Errorf("iptables-save (fake): unknown table %s", table)
	}
	return []byte(dumpTable(table, t)), nil
}

// Dump returns iptables-save text of the given tables of one family.
func (f *Fake) Dump(fam Family, tables ...string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, name := range tables {
		b.WriteString(dumpTable(name, f.tables[fam][name]))
	}
	return b.String()
}

// chainOrder returns built-in chains first (in save order), then the
// others sorted.
func chainOrder(table string, t *FakeTable) []string {
	out := slices.Clone(builtinChains[table])
	var user []string
	for name, c := range t.Chains {
		if !c.Builtin {
			user = append(user, name)
		}
	}
	slices.Sort(user)
	return append(out, user...)
}

func dumpTable(name string, t *FakeTable) string {
	var b strings.Builder
	b.WriteString("*" + name + "\n")
	order := chainOrder(name, t)
	for _, c := range order {
		if t.Chains[c].Builtin {
			b.WriteString(":" + c + " ACCEPT [0:0]\n")
		} else {
			b.WriteString(":" + c + " - [0:0]\n")
		}
	}
	for _, c := range order {
		for _, r := range t.Chains[c].Rules {
			b.WriteString("-A " + c + " " + JoinArgs(r) + "\n")
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// ListChain implements Runner.
func (f *Fake) ListChain(_ context.Context, fam Family, table, chain string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls["list"]++
	t := f.tables[fam][table]
	if t == nil || t.Chains[chain] == nil {
		return nil, &NotFoundError{Table: table, Chain: chain}
	}
	c := t.Chains[chain]
	var b strings.Builder
	if c.Builtin {
		b.WriteString("-P " + chain + " ACCEPT\n")
	} else {
		b.WriteString("-N " + chain + "\n")
	}
	for _, r := range c.Rules {
		b.WriteString("-A " + chain + " " + JoinArgs(r) + "\n")
	}
	return []byte(b.String()), nil
}

// SplitArgs splits one iptables-restore line into arguments, honouring
// double quotes as iptables-restore does.
func SplitArgs(line string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case ch == '"':
			inQuote = !inQuote
			have = true
		case ch == '\\' && inQuote && i+1 < len(line) && line[i+1] == '"':
			cur.WriteByte('"')
			i++
		case (ch == ' ' || ch == '\t') && !inQuote:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(ch)
			have = true
		}
	}
	if inQuote {
		return nil, fmt.Errorf("unterminated quote")
	}
	if have {
		out = append(out, cur.String())
	}
	return out, nil
}

// JoinArgs joins arguments into one line, quoting those that need it.
func JoinArgs(args []string) string {
	var b strings.Builder
	for i, a := range args {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(quote(a))
	}
	return b.String()
}

func quote(a string) string {
	if a == "" || strings.ContainsAny(a, " \t\"") {
		return `"` + strings.ReplaceAll(a, `"`, `\"`) + `"`
	}
	return a
}

// PruneEmpty resets a table that holds only empty built-in chains, as
// removing the nftables table behind iptables-nft does.
func (f *Fake) PruneEmpty(_ context.Context, fam Family, table string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[fam][table]
	if t == nil {
		return false, nil
	}
	for _, c := range t.Chains {
		if !c.Builtin || len(c.Rules) > 0 {
			return false, nil
		}
	}
	f.Calls["prune"]++
	f.tables[fam][table] = newFakeTable(table)
	return true, nil
}
