package iptables

import (
	"strings"
	"testing"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
)

func TestCanonRule(t *testing.T) {
	for _, tc := range []struct {
		name, ours, saved string
		same              bool
	}{
		{"reordered with /32", `-m comment --comment "a b" -m tcp -p tcp -d 10.96.0.10 --dport 80 ! -s 10.1.0.0/16 -j VIP-MARK-MASQ`,
			`-d 10.96.0.10/32 ! -s 10.1.0.0/16 -p tcp -m comment --comment "a b" -m tcp --dport 80 -j VIP-MARK-MASQ`, true},
		{"negation moved", `! -s 10.1.0.0/16 -d 10.96.0.10 -j X`, `-s 10.1.0.0/16 ! -d 10.96.0.10 -j X`, false},
		{"probability digits", `-m statistic --mode random --probability 0.5000000000 -j VIP-SEP-A`, `-m statistic --mode random --probability 0.50000000000 -j VIP-SEP-A`, true},
		{"probability differs", `-m statistic --mode random --probability 0.5000000000 -j VIP-SEP-A`, `-m statistic --mode random --probability 0.33333333349 -j VIP-SEP-A`, false},
		{"or-mark", `-j MARK --or-mark 0x4000`, `-j MARK --set-xmark 0x4000/0x4000`, true},
		{"xor-mark", `-j MARK --xor-mark 0x4000`, `-j MARK --set-xmark 0x4000/0x0`, true},
		{"mark match", `-m mark ! --mark 0x4000/0x4000 -j RETURN`, `-m mark ! --mark 0x4000/0x4000 -j RETURN`, true},
		{"recent defaults", `-m recent --name VIP-SEP-A --rcheck --seconds 60 --reap -j VIP-SEP-A`,
			`-m recent --rcheck --seconds 60 --reap --name VIP-SEP-A --mask 255.255.255.255 --rsource -j VIP-SEP-A`, true},
		{"recent other seconds", `-m recent --name A --rcheck --seconds 60 --reap -j A`, `-m recent --rcheck --seconds 61 --reap --name A --mask 255.255.255.255 --rsource -j A`, false},
		{"reject default", `-j REJECT`, `-j REJECT --reject-with icmp-port-unreachable`, true},
		{"reject tcp reset differs", `-j REJECT`, `-j REJECT --reject-with tcp-reset`, false},
		{"dnat target differs", `-m tcp -p tcp -j DNAT --to-destination 10.1.2.3:80`, `-p tcp -m tcp -j DNAT --to-destination 10.1.2.3:81`, false},
		{"other port", `-p tcp --dport 80 -j X`, `-p tcp --dport 81 -j X`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := canonRule(tc.ours), canonRule(tc.saved)
			if (a == b) != tc.same {
				t.Errorf("canon equal = %v, want %v\n ours:  %s\n saved: %s", a == b, tc.same, a, b)
			}
		})
	}
}

// TestKernelCanon checks canonRule against what the real iptables-save
// prints for every rule of every behaviour scenario.
func TestKernelCanon(t *testing.T) {
	for _, variant := range []string{"", "legacy"} {
		t.Run("variant="+variant, func(t *testing.T) { testKernelCanon(t, variant) })
	}
}

func testKernelCanon(t *testing.T, variant string) {
	ns := newNetns(t)
	run := &Exec{}
	p := kernelProxier(t, ns, variant, dataplanetest.BaseOptions(), run)
	fp, f := newFakeProxier(t, dataplanetest.BaseOptions())
	for _, sc := range dataplanetest.Scenarios() {
		for _, x := range []*Proxier{p, fp} {
			if err := x.Sync(ctx, sc.State(), true); err != nil {
				t.Fatal(err)
			}
		}
		for _, fam := range []Family{IPv4, IPv6} {
			for _, table := range []string{TableNAT, TableFilter} {
				out, err := run.Save(ctx, fam, table)
				if err != nil {
					t.Fatal(err)
				}
				kernel, ours := parseSave(out), parseSave([]byte(f.Dump(fam, table)))
				for _, c := range ours.chains {
					if !isOurs(c) {
						continue
					}
					kr, or := kernel.rules[c], ours.rules[c]
					if len(kr) != len(or) {
						t.Errorf("%s: %s %s %s: %d rules in kernel, %d ours", sc.Name, fam, table, c, len(kr), len(or))
						continue
					}
					for i := range or {
						if canonRule(or[i]) != canonRule(kr[i]) {
							t.Errorf("%s: %s %s %s rule %d:\n ours:   %s\n kernel: %s\n canon ours:   %s\n canon kernel: %s", sc.Name, fam, table, c, i+1, or[i], kr[i], canonRule(or[i]), canonRule(kr[i]))
						}
					}
				}
			}
		}
	}
}

// TestParseSaveLongLine: a rule longer than the scanner's first buffer
// (a comment or match list of 200 KB) is read whole, and the lines after
// it too.
func TestParseSaveLongLine(t *testing.T) {
	long := "-m comment --comment " + strings.Repeat("x", 200<<10)
	data := "*nat\n:KUBE-SVC-A - [0:0]\n-A KUBE-SVC-A " + long + "\n-A KUBE-SVC-A -j ACCEPT\nCOMMIT\n"
	got := parseSave([]byte(data)).rules["KUBE-SVC-A"]
	if len(got) != 2 || got[0] != long || got[1] != "-j ACCEPT" {
		t.Fatalf("parsed %d rules, want the long one and -j ACCEPT", len(got))
	}
}
