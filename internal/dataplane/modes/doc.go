// Package modes owns what proxy modes leave behind on a node: vipproxy's
// own modes (an earlier run in another mode, a crash during a mode change)
// and kube-proxy's (a migration: its iptables chains in every backend, its
// nftables tables, its IPVS interface, virtual servers and ipsets). It
// finds them, removes them and logs what it removed, in one place, so no
// dataplane knows another's rules. The wiring calls RemoveOthers once,
// after the running dataplane's first successful sync (make before break:
// the new rules are in before the old ones go, so no VIP is unserved), and
// RemoveAll for `vipproxy --cleanup`. A dataplane's own Cleanup still
// removes what that dataplane installed (a live mode switch).
package modes
