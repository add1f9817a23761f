package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
)

// Variants are the iptables backends a node can have, as Exec.Variant
// names them.
var Variants = []string{"nft", "legacy"}

// kubeletHints are the chains kubelet creates in the mangle table of the
// backend it uses; kube-proxy's image (iptables-wrapper) follows them.
var kubeletHints = [][]byte{[]byte(":KUBE-IPTABLES-HINT "), []byte(":KUBE-KUBELET-CANARY ")}

// DetectVariant chooses the iptables backend the way kube-proxy's image
// does (iptables-wrapper), so that vipproxy's rules land where kubelet's
// and kube-proxy's already are: the backend whose mangle table holds
// kubelet's hint chain (KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY); else
// the backend holding vipproxy's own canary chain (a restart, decided
// without reading whole tables); else the backend with more rules; else ""
// (the system's iptables). Backends
// whose iptables-<variant>-save is not installed are skipped. base gives
// the command prefix and environment (its Variant is ignored). The reason
// says what decided, for the log.
func DetectVariant(ctx context.Context, base *Exec) (variant, reason string) {
	type found struct {
		variant string
		hint    bool
		rules   int
	}
	var fs []found
	var ours []string // variants holding vipproxy's canary chain
	for _, v := range Variants {
		e := &Exec{Prefix: base.Prefix, Env: base.Env, Variant: v}
		bin := e.bin(IPv4, "tables-save")
		if len(base.Prefix) == 0 {
			if _, err := exec.LookPath(bin); err != nil {
				continue
			}
		}
		mangle, err := e.run(e.cmd(ctx, bin, "-t", "mangle"), nil)
		if err != nil {
			continue
		}
		f := found{variant: v}
		for _, h := range kubeletHints {
			f.hint = f.hint || bytes.Contains(mangle, h)
		}
		if _, err := e.run(e.cmd(ctx, e.bin(IPv4, "tables"), "-w", e.wait(), "-t", TableNAT, "-S", ChainCanary), nil); err == nil {
			ours = append(ours, v)
		}
		fs = append(fs, f)
	}
	var hinted []found
	for _, f := range fs {
		if f.hint {
			hinted = append(hinted, f)
		}
	}
	if len(hinted) == 1 {
		return hinted[0].variant, "kubelet's hint chain is in iptables-" + hinted[0].variant
	}
	// A restart: stay where vipproxy's own rules are, without reading a
	// table of 100,000 rules (iptables-nft-save: 7 s at 10,000 Services).
	if len(ours) == 1 {
		return ours[0], "vipproxy's own rules are in iptables-" + ours[0]
	}
	for i := range fs {
		e := &Exec{Prefix: base.Prefix, Env: base.Env, Variant: fs[i].variant}
		if all, err := e.run(e.cmd(ctx, e.bin(IPv4, "tables-save")), nil); err == nil {
			fs[i].rules = bytes.Count(all, []byte("\n-A "))
		}
	}
	best := found{}
	for _, f := range fs {
		if f.rules > best.rules {
			best = f
		}
	}
	if best.variant != "" {
		return best.variant, fmt.Sprintf("iptables-%s holds the most rules (%d)", best.variant, best.rules)
	}
	return "", "no backend holds rules or a hint: the system's iptables"
}
