package nftables

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
)

// fakeTracer walks the rules a Proxier left in a knftables.Fake for one
// packet, the way netfilter would: base chains of each hook in priority
// order, jumps, gotos, verdict maps, and every branch of a numgen choice.
// It interprets the rule syntax this package writes and fails loudly on
// anything else, so a layout change cannot silently pass.
type fakeTracer struct {
	fake *knftables.Fake
}

type pstate struct {
	src, dst  netip.Addr
	dport     uint16
	proto     string
	mark      uint32
	dnat      bool
	affinity  int
	verdict   string // "", "accept", "drop", "reject"
	masq      bool
	fromLocal bool
	dstLocal  bool
	events    string // "ct event set" mask, "" when not set
}

type flow int

const (
	flowNext flow = iota // continue with the next rule
	flowRet              // leave the chain (return, or after a goto)
	flowStop             // terminal verdict for this hook
)

type outcome struct {
	st pstate
	f  flow
}

type traceError string

func (t *fakeTracer) Trace(p dataplanetest.Packet) (v dataplanetest.Verdict) {
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(traceError); ok {
				panic(fmt.Sprintf("trace %s: %s", p, string(e)))
			}
			panic(r)
		}
	}()
	fam := knftables.IPv4Family
	if p.Dst.Is6() {
		fam = knftables.IPv6Family
	}
	t.fake.RLock()
	defer t.fake.RUnlock()
	table := t.fake.Tables[fam][TableName]
	if table == nil {
		return dataplanetest.Verdict{Action: dataplanetest.Accept}
	}
	w := &walker{table: table}
	st := pstate{src: p.Src, dst: p.Dst, dport: p.DstPort, proto: strings.ToLower(string(p.Proto)),
		fromLocal: p.FromLocalNode, dstLocal: p.DstLocal}
	var leaves []pstate
	if p.FromLocalNode {
		leaves = w.hook([]pstate{st}, knftables.OutputHook)
	} else {
		leaves = w.hook([]pstate{st}, knftables.PreroutingHook)
		var next []pstate
		for _, l := range leaves {
			hook := knftables.ForwardHook
			if !l.dnat && l.dstLocal {
				hook = knftables.InputHook
			}
			next = append(next, w.hook([]pstate{l}, hook)...)
		}
		leaves = next
	}
	var final []pstate
	for _, l := range leaves {
		if l.verdict == "drop" || l.verdict == "reject" {
			final = append(final, l)
			continue
		}
		final = append(final, w.hook([]pstate{l}, knftables.PostroutingHook)...)
	}
	return verdictOf(final)
}

func verdictOf(leaves []pstate) dataplanetest.Verdict {
	var v dataplanetest.Verdict
	seen := map[dataplanetest.Target]bool{}
	actions := map[dataplanetest.Action]bool{}
	for _, l := range leaves {
		switch {
		case l.verdict == "drop":
			actions[dataplanetest.Drop] = true
		case l.verdict == "reject":
			actions[dataplanetest.Reject] = true
		case l.dnat:
			actions[dataplanetest.DNAT] = true
			tg := dataplanetest.Target{Endpoint: netip.AddrPortFrom(l.dst, l.dport), Masquerade: l.masq}
			if !seen[tg] {
				seen[tg] = true
				v.Targets = append(v.Targets, tg)
			}
			if l.affinity > v.AffinitySeconds {
				v.AffinitySeconds = l.affinity
			}
		default:
			actions[dataplanetest.Accept] = true
		}
	}
	if len(actions) != 1 {
		panic(traceError(fmt.Sprintf("branches disagree: %v", actions)))
	}
	for a := range actions {
		v.Action = a
	}
	return v
}

type walker struct {
	table *knftables.FakeTable
	depth int
}

var priorities = map[string]int{"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}

func parsePriority(s string) int {
	f := strings.Fields(s)
	base, ok := priorities[f[0]]
	if !ok {
		n, err := strconv.Atoi(f[0])
		if err != nil {
			panic(traceError("bad priority " + s))
		}
		base = n
	}
	if len(f) == 3 {
		n, _ := strconv.Atoi(f[2])
		if f[1] == "-" {
			n = -n
		}
		base += n
	}
	return base
}

// hook runs every base chain of hook, in priority order, on each state.
func (w *walker) hook(states []pstate, hook knftables.BaseChainHook) []pstate {
	type bc struct {
		name string
		prio int
	}
	var chains []bc
	for name, c := range w.table.Chains {
		if c.Hook != nil && *c.Hook == hook {
			chains = append(chains, bc{name, parsePriority(string(*c.Priority))})
		}
	}
	sort.Slice(chains, func(i, j int) bool {
		if chains[i].prio != chains[j].prio {
			return chains[i].prio < chains[j].prio
		}
		return chains[i].name < chains[j].name
	})
	for _, c := range chains {
		var next []pstate
		for _, st := range states {
			if st.verdict == "drop" || st.verdict == "reject" {
				next = append(next, st)
				continue
			}
			for _, o := range w.chain(c.name, st) {
				if o.st.verdict == "accept" {
					o.st.verdict = ""
				}
				next = append(next, o.st)
			}
		}
		states = next
	}
	return states
}

// chain evaluates a chain; outcomes are flowNext (fell off the end or
// returned) or flowStop.
func (w *walker) chain(name string, st pstate) []outcome {
	c := w.table.Chains[name]
	if c == nil {
		panic(traceError("no chain " + name))
	}
	w.depth++
	defer func() { w.depth-- }()
	if w.depth > 32 {
		panic(traceError("chain loop at " + name))
	}
	states := []pstate{st}
	var out []outcome
	for _, r := range c.Rules {
		var next []pstate
		for _, s := range states {
			for _, o := range w.terms(strings.Fields(r.Rule), 0, s) {
				switch o.f {
				case flowNext:
					next = append(next, o.st)
				case flowRet:
					out = append(out, outcome{o.st, flowNext})
				case flowStop:
					out = append(out, o)
				}
			}
		}
		states = next
	}
	for _, s := range states {
		out = append(out, outcome{s, flowNext})
	}
	return out
}

// braces returns the items of "{ a, b : c }" starting at toks[i] == "{"
// and the index after "}".
func braces(toks []string, i int) ([]string, int) {
	if toks[i] != "{" {
		return []string{toks[i]}, i + 1
	}
	j := i + 1
	for toks[j] != "}" {
		j++
	}
	items := strings.Split(strings.Join(toks[i+1:j], " "), ",")
	for k := range items {
		items[k] = strings.TrimSpace(items[k])
	}
	return items, j + 1
}

// expr reads a (concatenated) expression at toks[i]; it returns the
// value of each branch (numgen yields one per choice) and the next index.
func (w *walker) expr(toks []string, i int, st pstate) ([]string, int) {
	vals := []string{""}
	for {
		var v []string
		switch toks[i] {
		case "ip", "ip6":
			switch toks[i+1] {
			case "saddr":
				v = []string{st.src.String()}
			case "daddr":
				v = []string{st.dst.String()}
			default:
				panic(traceError("unknown " + toks[i] + " " + toks[i+1]))
			}
			i += 2
		case "meta":
			switch toks[i+1] {
			case "l4proto":
				v = []string{st.proto}
			case "mark":
				v = []string{strconv.FormatUint(uint64(st.mark), 10)}
			default:
				panic(traceError("unknown meta " + toks[i+1]))
			}
			i += 2
		case "th":
			v = []string{strconv.Itoa(int(st.dport))}
			i += 2
		case "tcp", "udp", "sctp":
			// "tcp dport" implies "meta l4proto tcp": another protocol
			// yields a value no set or map holds.
			v = []string{strconv.Itoa(int(st.dport))}
			if st.proto != toks[i] {
				v = []string{"\x00" + toks[i] + "-mismatch"}
			}
			i += 2
		case "ct":
			switch toks[i+1] {
			case "state":
				v = []string{"new"}
			case "status":
				if st.dnat {
					v = []string{"dnat"}
				} else {
					v = []string{"none"}
				}
			}
			i += 2
		case "fib":
			local := st.dstLocal
			if toks[i+1] == "saddr" {
				local = st.fromLocal || dataplanetest.IsLocalAddr(st.src)
			}
			if local {
				v = []string{"local"}
			} else {
				v = []string{"unicast"}
			}
			i += 3
		case "numgen":
			n, err := strconv.Atoi(toks[i+3])
			if err != nil {
				panic(traceError("bad numgen"))
			}
			for k := 0; k < n; k++ {
				v = append(v, strconv.Itoa(k))
			}
			i += 4
		case "jhash":
			// jhash ip saddr mod M seed S: any slot, as far as a trace
			// can tell.
			n, err := strconv.Atoi(toks[i+4])
			if err != nil || toks[i+3] != "mod" || toks[i+5] != "seed" {
				panic(traceError("bad jhash"))
			}
			for k := 0; k < n; k++ {
				v = append(v, strconv.Itoa(k))
			}
			i += 7
		default:
			panic(traceError("unknown expression " + toks[i]))
		}
		var nv []string
		for _, a := range vals {
			for _, b := range v {
				if a == "" {
					nv = append(nv, b)
				} else {
					nv = append(nv, a+" . "+b)
				}
			}
		}
		vals = nv
		if i < len(toks) && toks[i] == "." {
			i++
			continue
		}
		return vals, i
	}
}

func parseNum(s string) uint32 {
	n, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		panic(traceError("bad number " + s))
	}
	return uint32(n)
}

// member reports whether v is in the set described by items (addresses,
// prefixes, or exact strings) or by a named set "@name".
func (w *walker) member(v string, items []string) bool {
	if len(items) == 1 && strings.HasPrefix(items[0], "@") {
		name := items[0][1:]
		if s := w.table.Sets[name]; s != nil {
			if s.Flags != nil && len(s.Flags) > 0 {
				return false // dynamic (affinity) sets start empty
			}
			var keys []string
			for _, e := range s.Elements {
				keys = append(keys, strings.Join(e.Key, " . "))
			}
			return w.member(v, keys)
		}
		panic(traceError("no set " + name))
	}
	for _, it := range items {
		if it == v {
			return true
		}
		if p, err := netip.ParsePrefix(it); err == nil {
			if a, err := netip.ParseAddr(v); err == nil && p.Contains(a) {
				return true
			}
		}
	}
	return false
}

func (w *walker) lookup(key string, toks []string, i int) (string, bool, int) {
	if strings.HasPrefix(toks[i], "@") {
		m := w.table.Maps[toks[i][1:]]
		if m == nil {
			panic(traceError("no map " + toks[i]))
		}
		for _, e := range m.Elements {
			if strings.Join(e.Key, " . ") == key {
				return strings.Join(e.Value, " . "), true, i + 1
			}
		}
		return "", false, i + 1
	}
	items, j := braces(toks, i)
	for _, it := range items {
		kv := strings.SplitN(it, " : ", 2)
		if len(kv) == 2 && kv[0] == key {
			return kv[1], true, j
		}
	}
	return "", false, j
}

// terms evaluates the rule toks from index i on state st.
func (w *walker) terms(toks []string, i int, st pstate) []outcome {
	if i >= len(toks) {
		return []outcome{{st, flowNext}}
	}
	switch toks[i] {
	case "jump", "goto":
		var out []outcome
		for _, o := range w.chain(toks[i+1], st) {
			if o.f == flowStop {
				out = append(out, o)
			} else if toks[i] == "goto" {
				out = append(out, outcome{o.st, flowRet})
			} else {
				out = append(out, outcome{o.st, flowNext})
			}
		}
		return out
	case "return":
		return []outcome{{st, flowRet}}
	case "drop", "accept":
		st.verdict = toks[i]
		return []outcome{{st, flowStop}}
	case "reject":
		st.verdict = "reject"
		return []outcome{{st, flowStop}}
	case "masquerade":
		st.masq = true
		st.verdict = "accept"
		return []outcome{{st, flowStop}}
	case "update":
		set := w.table.Sets[strings.TrimPrefix(toks[i+1], "@")]
		if set == nil || set.Timeout == nil {
			panic(traceError("update of unknown or timeout-less set " + toks[i+1]))
		}
		st.affinity = int(set.Timeout.Seconds())
		_, j := braces(toks, i+2)
		return w.terms(toks, j, st)
	case "dnat":
		// dnat ip to A:P | dnat ip6 to [A]:P | dnat ip to <expr> map { k : A . P, ... } | @map
		i += 3
		if _, err := netip.ParseAddrPort(toks[i]); err != nil {
			keys, j := w.expr(toks, i, st)
			if toks[j] != "map" {
				panic(traceError("dnat numgen without map"))
			}
			var out []outcome
			for _, k := range keys {
				val, ok, _ := w.lookup(k, toks, j+1)
				if !ok {
					// A lookup miss ends the rule without a verdict.
					out = append(out, outcome{st, flowNext})
					continue
				}
				ap := strings.Split(val, " . ")
				s := st
				s.dst = netip.MustParseAddr(ap[0])
				s.dport = uint16(parseNum(ap[1]))
				s.dnat, s.verdict = true, "accept"
				out = append(out, outcome{s, flowStop})
			}
			return out
		}
		ap := netip.MustParseAddrPort(toks[i])
		st.dst, st.dport, st.dnat, st.verdict = ap.Addr(), ap.Port(), true, "accept"
		return []outcome{{st, flowStop}}
	}
	// "ct event set MASK": the events of the flow's conntrack entry.
	if toks[i] == "ct" && toks[i+1] == "event" && toks[i+2] == "set" {
		st.events = toks[i+3]
		return w.terms(toks, i+4, st)
	}
	// "limit rate N/UNIT [burst B packets]": under the rate or over it.
	if toks[i] == "limit" {
		j := i + 3
		if j < len(toks) && toks[j] == "burst" {
			j += 3
		}
		return append(w.terms(toks, j, st), outcome{st, flowNext})
	}
	// A match or "meta mark set".
	if toks[i] == "meta" && toks[i+1] == "mark" && i+2 < len(toks) && toks[i+2] == "set" {
		// meta mark set meta mark (|,^) M
		m := parseNum(toks[i+6])
		switch toks[i+5] {
		case "|":
			st.mark |= m
		case "^":
			st.mark ^= m
		default:
			panic(traceError("unknown mark op " + toks[i+5]))
		}
		return w.terms(toks, i+7, st)
	}
	vals, j := w.expr(toks, i, st)
	var out []outcome
	for _, v := range vals {
		switch {
		case toks[j] == "vmap":
			verdict, ok, k := w.lookup(v, toks, j+1)
			if !ok {
				out = append(out, outcome{st, flowNext})
				continue
			}
			res := w.terms(strings.Fields(verdict), 0, st)
			// A vmap verdict ends the rule.
			_ = k
			out = append(out, res...)
		case toks[j] == "!=":
			items, k := braces(toks, j+1)
			if !w.member(v, items) {
				out = append(out, w.terms(toks, k, st)...)
			} else {
				out = append(out, outcome{st, flowNext})
			}
		case toks[j] == "&":
			// meta mark & M == V
			m, want := parseNum(toks[j+1]), parseNum(toks[j+3])
			if uint32(parseNum(v))&m == want {
				out = append(out, w.terms(toks, j+4, st)...)
			} else {
				out = append(out, outcome{st, flowNext})
			}
		default:
			items, k := braces(toks, j)
			if w.member(v, items) {
				out = append(out, w.terms(toks, k, st)...)
			} else {
				out = append(out, outcome{st, flowNext})
			}
		}
	}
	return out
}
