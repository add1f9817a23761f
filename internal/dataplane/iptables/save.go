package iptables

import (
	"bytes"
	"iter"
	"strconv"
	"strings"
)

// savedTable is one table of iptables-save output.
type savedTable struct {
	chains  []string            // in save order
	set     map[string]bool     // chains
	builtin map[string]bool     // chains with a policy
	rules   map[string][]string // chain -> rule lines after "-A chain "
}

// parseSave parses iptables-save output for one table. Lines it does not
// understand are ignored. It walks data in place: only the chain names and
// rules it keeps are copied (a bufio.Scanner's 1 MiB line buffer per call
// was most of what a cleanup pass allocated: 13 MB after a cold start at
// 50,000 Services, resident until the next collection).
func parseSave(data []byte) *savedTable {
	t := &savedTable{builtin: map[string]bool{}, rules: map[string][]string{}, set: map[string]bool{}}
	for line := range lines(data) {
		switch {
		case len(line) > 0 && line[0] == ':':
			f := strings.Fields(string(line[1:]))
			if len(f) < 2 {
				continue
			}
			t.chains = append(t.chains, f[0])
			t.set[f[0]] = true
			if f[1] != "-" {
				t.builtin[f[0]] = true
			}
		case bytes.HasPrefix(line, []byte("-A ")):
			rest := string(line[3:])
			i := strings.IndexByte(rest, ' ')
			if i < 0 {
				t.rules[rest] = append(t.rules[rest], "")
				continue
			}
			t.rules[rest[:i]] = append(t.rules[rest[:i]], rest[i+1:])
		}
	}
	return t
}

// lines yields the lines of data, in place, without their line ends ("\n",
// and a "\r" before it); a last line without one too.
func lines(data []byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		for rest := data; len(rest) > 0; {
			line := rest
			if i := bytes.IndexByte(rest, '\n'); i >= 0 {
				line, rest = rest[:i], rest[i+1:]
			} else {
				rest = nil
			}
			if !yield(bytes.TrimSuffix(line, []byte("\r"))) {
				return
			}
		}
	}
}

func (t *savedTable) has(chain string) bool { return t.set[chain] }

// ruleTarget returns the -j target of a saved rule.
func ruleTarget(rule string) string {
	args, err := SplitArgs(rule)
	if err != nil {
		return ""
	}
	return jumpTarget(args)
}

// removalInput returns iptables-restore inputs, to be restored in order,
// that delete every chain of t for which remove is true, after deleting
// the rules of other chains that jump to them. It returns nil when there
// is nothing to remove.
//
// Up to limit chains it is one transaction. Beyond that
// (iptables-nft-restore costs O(C²) in the chains C one transaction names,
// see restoreInput), the first input deletes the jumps from the kept
// chains, which makes every chain to remove unreachable at once, together
// with the first chains to remove; each following input flushes and
// deletes at most about limit chains that no remaining
// chain jumps to any more (a chain goes in the same input as, or after,
// every chain that jumps to it), so every transaction is valid and each
// leaves only unreachable chains behind.
func removalInput(table string, t *savedTable, remove func(string) bool, limit int) [][]byte {
	var gone []string
	goneSet := map[string]bool{}
	for _, c := range t.chains {
		if !t.builtin[c] && remove(c) {
			gone = append(gone, c)
			goneSet[c] = true
		}
	}
	var dels []string
	// referrers counts, per chain to remove, the chains to remove that
	// jump to it (each chain once per rule).
	referrers := map[string]int{}
	for _, c := range t.chains {
		rules := t.rules[c]
		for i := len(rules) - 1; i >= 0; i-- {
			target := ruleTarget(rules[i])
			if !goneSet[target] {
				continue
			}
			if goneSet[c] {
				if target != c {
					referrers[target]++
				}
				continue
			}
			dels = append(dels, "-D "+c+" "+strconv.Itoa(i+1))
		}
	}
	if len(gone) == 0 && len(dels) == 0 {
		return nil
	}
	chunks := [][]string{gone}
	if len(gone) > limit {
		chunks = removalChunks(t, gone, goneSet, referrers, limit)
	}
	out := make([][]byte, 0, len(chunks))
	for i, chunk := range chunks {
		var b bytes.Buffer
		b.WriteString("*" + table + "\n")
		for _, c := range chunk {
			b.WriteString(":" + c + " - [0:0]\n")
		}
		if i == 0 {
			for _, d := range dels {
				b.WriteString(d + "\n")
			}
		}
		for _, c := range chunk {
			b.WriteString("-X " + c + "\n")
		}
		b.WriteString("COMMIT\n")
		out = append(out, b.Bytes())
	}
	return out
}

// removalChunks splits gone into chunks of about limit chains, each
// removable once the chunks before it are gone: Kahn's order over the
// jumps among them (referrers counts, per chain, the chains of gone that
// jump to it; it is consumed). A loop, which the kernel forbids, would
// leave the rest in the last chunk.
func removalChunks(t *savedTable, gone []string, goneSet map[string]bool, referrers map[string]int, limit int) [][]string {
	var chunks [][]string
	var ready, chunk []string
	for _, c := range gone {
		if referrers[c] == 0 {
			ready = append(ready, c)
		}
	}
	seen := map[string]bool{}
	for len(ready) > 0 {
		c := ready[0]
		ready = ready[1:]
		chunk = append(chunk, c)
		seen[c] = true
		for _, r := range t.rules[c] {
			if target := ruleTarget(r); goneSet[target] && target != c {
				if referrers[target]--; referrers[target] == 0 {
					ready = append(ready, target)
				}
			}
		}
		if len(chunk) >= limit {
			chunks = append(chunks, chunk)
			chunk = nil
		}
	}
	for _, c := range gone {
		if !seen[c] {
			chunk = append(chunk, c)
		}
	}
	if len(chunk) > 0 {
		chunks = append(chunks, chunk)
	}
	return chunks
}

// kubeProxyChains are the fixed chain names kube-proxy's iptables mode
// owns. Chains kubelet owns (KUBE-FIREWALL, KUBE-KUBELET-CANARY,
// KUBE-MARK-DROP, KUBE-IPTABLES-HINT) are left alone.
var kubeProxyChains = map[string]bool{
	"KUBE-SERVICES": true, "KUBE-EXTERNAL-SERVICES": true, "KUBE-NODEPORTS": true, "KUBE-POSTROUTING": true,
	"KUBE-FORWARD": true, "KUBE-PROXY-FIREWALL": true, "KUBE-PROXY-CANARY": true, "KUBE-MARK-MASQ": true,
	"KUBE-LOAD-BALANCER": true, "KUBE-LOAD-BALANCER-LOCAL": true, "KUBE-LOAD-BALANCER-FW": true,
	"KUBE-LOAD-BALANCER-SOURCE-IP": true, "KUBE-LOAD-BALANCER-SOURCE-CIDR": true, "KUBE-NODE-PORT": true,
	// The ipvs mode's filter chains (pkg/proxy/ipvs iptablesChains in
	// v1.34): KUBE-IPVS-FILTER matches five KUBE-* ipsets, which cannot be
	// destroyed while it exists.
	"KUBE-SOURCE-RANGES-FIREWALL": true, "KUBE-IPVS-FILTER": true, "KUBE-IPVS-OUT-FILTER": true,
}

// isKubeProxyChain reports whether chain belongs to kube-proxy (iptables
// or ipvs mode).
func isKubeProxyChain(chain string) bool {
	if kubeProxyChains[chain] {
		return true
	}
	for _, p := range []string{"KUBE-SVC-", "KUBE-SEP-", "KUBE-FW-", "KUBE-XLB-", "KUBE-EXT-", "KUBE-SVL-"} {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

func isOurs(chain string) bool { return strings.HasPrefix(chain, ChainPrefix) }
