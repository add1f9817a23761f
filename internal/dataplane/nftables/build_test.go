package nftables

import (
	"context"
	"strings"
	"testing"
	"unsafe"

	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/model"
)

// TestInternSharesChains: every fragment's shared chains are the
// builder's one copy, and its map verdicts jump to them, after a full
// build and after a partial update that makes a new shared chain; private
// chains stay the port's own.
func TestInternSharesChains(t *testing.T) {
	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	p, err := New(o, NewFakeTransport())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st := scaleState(60, 3)
	st.Ports[7].AffinityTimeoutSeconds = 600 // one port with private sticky chains
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	// A fourth endpoint on port 3: its fragment is built by update and
	// jumps to int-cluster-tcp-4, a chain no other port has.
	next := changeOne(st, 3, 1)
	sp := *next.Ports[3]
	sp.Endpoints = append(sp.Endpoints[:len(sp.Endpoints):len(sp.Endpoints)], model.Endpoint{IP: sp.Endpoints[0].IP.Next(), Port: 8080, Ready: true, Serving: true})
	next.Ports[3] = dataplanetest.Fill(&sp)
	if err := p.Sync(ctx, next, false); err != nil {
		t.Fatal(err)
	}

	tab := p.b.shared[knftables.IPv4Family]
	shared, private, verdicts := 0, 0, 0
	for name, pe := range p.applied[knftables.IPv4Family].ports {
		for _, c := range pe.fr.chains {
			s := tab[c.name]
			switch {
			case !c.shared:
				private++
				if s != nil {
					t.Errorf("%s: private chain %s is in the shared table", name, c.name)
				}
			case s == nil:
				t.Errorf("%s: shared chain %s not interned", name, c.name)
			case unsafe.StringData(c.name) != unsafe.StringData(s.name) || &c.rules[0] != &s.rules[0]:
				t.Errorf("%s: shared chain %s is a copy, not the builder's", name, c.name)
			default:
				shared++
			}
		}
		for i := range pe.fr.elems {
			if to, ok := strings.CutPrefix(pe.fr.value(i), "goto "); ok && tab[to] != nil {
				verdicts++
			}
		}
	}
	if tab["int-cluster-tcp-4"] == nil {
		t.Error("the chain made by the partial update is not interned")
	}
	if shared < 60 || verdicts < 59 || private == 0 {
		t.Errorf("checked %d shared chains, %d verdicts, %d private chains; want >= 60, >= 59, > 0", shared, verdicts, private)
	}
}
