package iptables

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	dt "github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
)

// fakeTracer walks a Fake's rules for one packet the way netfilter would:
// nat PREROUTING (or OUTPUT for the node's own packets), routing, filter
// INPUT/FORWARD/OUTPUT, nat POSTROUTING. Random choices (-m statistic) are
// explored both ways; -m recent --rcheck never matches (no history) and is
// recorded so a later --set reports the affinity timeout.
type fakeTracer struct {
	f    *Fake
	sets *ipset.Fake // hairpin sets; nil in kube-proxy's layout
}

type branch struct {
	dst      netip.Addr
	dport    uint16
	dnat     bool
	mark     uint32
	masq     bool
	rcheck   map[string]int
	affinity int
	term     string // terminal target reached in the current hook
}

func (b branch) clone() branch {
	b.rcheck = maps.Clone(b.rcheck)
	return b
}

func (tr fakeTracer) Trace(p dt.Packet) dt.Verdict {
	fam := IPv4
	if p.Dst.Is6() {
		fam = IPv6
	}
	nat, filter := tr.f.Table(fam, TableNAT), tr.f.Table(fam, TableFilter)
	start := branch{dst: p.Dst, dport: p.DstPort, rcheck: map[string]int{}}
	var final []branch
	hooks := func(b branch) {
		// Returns after filter/postrouting for one branch.
		var fchain string
		switch {
		case p.FromLocalNode:
			fchain = "OUTPUT"
		case !b.dnat && p.DstLocal:
			fchain = "INPUT"
		default:
			fchain = "FORWARD"
		}
		for _, fb := range tr.run(filter, fchain, p, b, 0) {
			if fb.term == "DROP" || fb.term == "REJECT" {
				final = append(final, fb)
				continue
			}
			fb.term = ""
			if fchain == "INPUT" {
				final = append(final, fb)
				continue
			}
			for _, pb := range tr.run(nat, "POSTROUTING", p, fb, 0) {
				if pb.term == "MASQUERADE" {
					pb.masq = true
				}
				final = append(final, pb)
			}
		}
	}
	first := "PREROUTING"
	if p.FromLocalNode {
		first = "OUTPUT"
	}
	for _, b := range tr.run(nat, first, p, start, 0) {
		if b.term == "DROP" || b.term == "REJECT" {
			final = append(final, b)
			continue
		}
		b.term = ""
		hooks(b)
	}
	return verdictOf(final)
}

func verdictOf(final []branch) dt.Verdict {
	var v dt.Verdict
	for _, b := range final {
		switch b.term {
		case "DROP":
			return dt.DropV
		case "REJECT":
			return dt.RejectV
		}
	}
	seen := map[dt.Target]bool{}
	for _, b := range final {
		if !b.dnat {
			return dt.AcceptV // some branch not translated: report as accept
		}
		v.Action = dt.DNAT
		t := dt.Target{Endpoint: netip.AddrPortFrom(b.dst, b.dport), Masquerade: b.masq}
		if !seen[t] {
			seen[t] = true
			v.Targets = append(v.Targets, t)
		}
		if b.affinity != 0 {
			v.AffinitySeconds = b.affinity
		}
	}
	if len(final) == 0 {
		return dt.AcceptV
	}
	return v
}

// run walks chain for b and returns the resulting branches; term is set
// on those that reached a terminal target.
func (tr fakeTracer) run(t *FakeTable, chain string, p dt.Packet, b branch, depth int) []branch {
	if depth > 20 {
		panic("trace: chain depth > 20 at " + chain)
	}
	c := t.Chains[chain]
	if c == nil {
		panic("trace: no chain " + chain)
	}
	active := []branch{b}
	var done []branch
	for _, rule := range c.Rules {
		var next []branch
		for _, ab := range active {
			m, prob := tr.match(rule, p, &ab)
			if prob {
				nb := ab.clone()
				next = append(next, nb) // not chosen
			}
			if !m {
				if !prob {
					next = append(next, ab)
				}
				continue
			}
			target, targs := targetOf(rule)
			switch target {
			case "":
				next = append(next, ab)
			case "RETURN":
				done = append(done, ab)
			case "ACCEPT", "DROP", "REJECT":
				ab.term = target
				done = append(done, ab)
			case "MASQUERADE":
				ab.term = target
				done = append(done, ab)
			case "MARK":
				for i := 0; i+1 < len(targs); i += 2 {
					v, err := strconv.ParseUint(targs[i+1], 0, 32)
					if err != nil {
						panic(err)
					}
					switch targs[i] {
					case "--or-mark":
						ab.mark |= uint32(v)
					case "--xor-mark":
						ab.mark ^= uint32(v)
					case "--set-mark":
						ab.mark = uint32(v)
					default:
						panic("trace: MARK " + targs[i])
					}
				}
				next = append(next, ab)
			case "DNAT":
				if len(targs) < 2 || targs[0] != "--to-destination" {
					panic("trace: DNAT args " + strings.Join(targs, " "))
				}
				ap, err := netip.ParseAddrPort(targs[1])
				if err != nil {
					panic(err)
				}
				ab.dst, ab.dport, ab.dnat, ab.term = ap.Addr(), ap.Port(), true, "DNAT"
				done = append(done, ab)
			default:
				for _, rb := range tr.run(t, target, p, ab, depth+1) {
					if rb.term != "" {
						done = append(done, rb)
					} else {
						next = append(next, rb)
					}
				}
			}
		}
		active = next
		if len(active) == 0 {
			break
		}
	}
	return append(done, active...)
}

func targetOf(rule []string) (string, []string) {
	for i := 0; i+1 < len(rule); i++ {
		if rule[i] == "-j" {
			return rule[i+1], rule[i+2:]
		}
	}
	return "", nil
}

func inPrefix(s string, a netip.Addr) bool {
	if pr, err := netip.ParsePrefix(s); err == nil {
		return pr.Contains(a)
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		panic(fmt.Sprintf("trace: bad address %q", s))
	}
	return ip == a
}

// match evaluates rule's matches for b. prob is true when the rule has a
// random match (the caller explores both outcomes). --set side effects are
// applied to b.
func (tr fakeTracer) match(rule []string, p dt.Packet, b *branch) (matched, prob bool) {
	neg := false
	ok := true
	check := func(m bool) {
		if m == neg {
			ok = false
		}
		neg = false
	}
	var recentName string
	rcheck, set := false, false
	secs := 0
	for i := 0; i < len(rule); i++ {
		tok := rule[i]
		arg := func() string { i++; return rule[i] }
		switch tok {
		case "!":
			neg = true
		case "-m", "--comment", "--mode":
			arg()
		case "--match-set":
			name, dirs := arg(), arg()
			if tr.sets == nil {
				panic("trace: --match-set " + name + " without sets")
			}
			switch dirs {
			case "dst,dst,src": // hairpin: endpoint,proto:port,endpoint
				m := hairpinKind.entry(newSetMember(netip.AddrPortFrom(b.dst, b.dport), p.Proto))
				check(b.dst == p.Src && slices.Contains(tr.sets.Members(name), m.String()))
			case "dst,dst": // ClusterIP,proto:port
				m := clusterKind.entry(newSetMember(netip.AddrPortFrom(b.dst, b.dport), p.Proto))
				check(slices.Contains(tr.sets.Members(name), m.String()))
			default:
				panic("trace: --match-set " + name + " " + dirs)
			}
		case "-p":
			check(strings.EqualFold(arg(), string(p.Proto)))
		case "-s":
			check(inPrefix(arg(), p.Src))
		case "-d":
			check(inPrefix(arg(), b.dst))
		case "--dport":
			check(arg() == strconv.Itoa(int(b.dport)))
		case "--dst-type":
			if arg() != "LOCAL" {
				panic("trace: dst-type")
			}
			check(!b.dnat && dataplanetest.IsLocalAddr(b.dst))
		case "--src-type":
			if arg() != "LOCAL" {
				panic("trace: src-type")
			}
			check(p.FromLocalNode)
		case "--ctstate":
			check(strings.Contains(arg(), "NEW"))
		case "--mark":
			vm := strings.SplitN(arg(), "/", 2)
			v, _ := strconv.ParseUint(vm[0], 0, 32)
			m := uint64(0xffffffff)
			if len(vm) == 2 {
				m, _ = strconv.ParseUint(vm[1], 0, 32)
			}
			check(uint64(b.mark)&m == v)
		case "--probability", "--every":
			// Random or nth choice: either branch can be taken.
			arg()
			prob = true
		case "--packet":
			arg()
		case "--name":
			recentName = arg()
		case "--rcheck":
			rcheck = true
		case "--set":
			set = true
		case "--seconds":
			secs, _ = strconv.Atoi(arg())
		case "--reap":
		case "-j":
			i = len(rule)
		default:
			panic("trace: unknown token " + tok + " in " + JoinArgs(rule))
		}
	}
	if rcheck {
		b.rcheck[recentName] = secs
		return false, false
	}
	if !ok {
		return false, false
	}
	if set {
		if s, found := b.rcheck[recentName]; found {
			b.affinity = s
		} else {
			b.affinity = -1
		}
	}
	return true, prob
}
