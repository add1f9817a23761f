package ipvs

// Tests of ClientIP affinity shorter than IPVS can hold (sticky.go).

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/model"
)

// TestShortAffinity: ClientIP affinity shorter than IPVS's persistence
// hold (TCP TIME_WAIT 120 s, the UDP timeout) is not persistence but a
// DNAT and a learning rule per real server, rewritten (nat sticky chains
// only) when the real servers change, and gone with the Service.
func TestShortAffinity(t *testing.T) {
	for _, tc := range []struct {
		name       string
		proto      model.Protocol
		udpTimeout time.Duration
		timeout    int
		sticky     bool
	}{
		{"tcp 2s", model.TCP, 0, 2, true},
		{"tcp 119s", model.TCP, 0, 119, true},
		{"tcp 120s: persistence", model.TCP, 0, 120, false},
		{"udp 299s", model.UDP, 0, 299, true},
		{"udp 300s: persistence", model.UDP, 0, 300, false},
		{"udp 60s under udpTimeout 30s: persistence", model.UDP, 30 * time.Second, 60, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBed(t, func(o *Options) { o.Timeouts.UDP = tc.udpTimeout })
			sp := port("default/s", "", tc.proto, 80, "10.96.0.40")
			sp.AffinityTimeoutSeconds = tc.timeout
			sp.Endpoints = []model.Endpoint{ep("10.1.1.9", 8080, true)}
			fill(sp)
			b.sync(t, state(sp), true)
			svcs, _ := b.kernel.Services()
			if len(svcs) != 1 || (svcs[0].Flags&FlagPersistent != 0) == tc.sticky {
				t.Fatalf("virtual servers %v: persistent should be %v", svcs, !tc.sticky)
			}
			rules := b.ipt.Dump(iptables.IPv4, iptables.TableNAT)
			p := strings.ToLower(string(tc.proto))
			dnat := fmt.Sprintf("-A VIPVS-AFFINITY -d 10.96.0.40/32 -p %s -m %s --dport 80 -m recent --rcheck --seconds %d --reap --name %s --rsource -j DNAT --to-destination 10.1.1.9:8080",
				p, p, tc.timeout, sticky{vs: svcs[0].ServiceKey, dest: netip.MustParseAddrPort("10.1.1.9:8080")}.list())
			learn := fmt.Sprintf("-A VIPVS-AFFINITY-LEARN -d 10.1.1.9/32 -p %s -m %s --dport 8080 -m conntrack --ctorigdst 10.96.0.40 --ctorigdstport 80 -m recent --set --name %s --rsource",
				p, p, sticky{vs: svcs[0].ServiceKey, dest: netip.MustParseAddrPort("10.1.1.9:8080")}.list())
			for _, r := range []string{dnat, learn} {
				if strings.Contains(rules, r) != tc.sticky {
					t.Errorf("nat has %q: %v, want %v:\n%s", r, !tc.sticky, tc.sticky, rules)
				}
			}
			for _, r := range []string{"-A VIPVS-SERVICES -j VIPVS-AFFINITY", "-A VIPVS-POSTROUTING -j VIPVS-AFFINITY-LEARN"} {
				if !strings.Contains(rules, r) {
					t.Errorf("nat lacks the jump %q:\n%s", r, rules)
				}
			}
			if !tc.sticky {
				return
			}
			// One more endpoint: the nat sticky chains are rewritten (one
			// restore, IPv4 only), the rest of the table is not.
			b.clear()
			sp2 := *sp
			sp2.Endpoints = append(slices.Clone(sp.Endpoints), ep("10.1.2.9", 8080, false))
			fill(&sp2)
			b.sync(t, state(&sp2), false)
			if len(b.ipt.Restores) != 1 || b.ipt.Restores[0].Table != iptables.TableNAT {
				t.Fatalf("restores after an endpoint was added: %+v, want one of nat", b.ipt.Restores)
			}
			if got := strings.Count(b.ipt.Dump(iptables.IPv4, iptables.TableNAT), "-m recent"); got != 4 {
				t.Errorf("%d recent rules after an endpoint was added, want 4", got)
			}
			// The same state again: nothing written.
			b.clear()
			b.sync(t, state(&sp2), false)
			want(t, "iptables restores, same state", len(b.ipt.Restores), 0)
			// The Service gone: its rules go.
			b.sync(t, state(), false)
			if got := strings.Count(b.ipt.Dump(iptables.IPv4, iptables.TableNAT), "-m recent"); got != 0 {
				t.Errorf("%d recent rules after the Service was removed, want 0", got)
			}
		})
	}
}
