package nftables

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/netnstest"
)

// newNetns creates a network namespace named vpnft-<suffix>-<pid>-<n>,
// removed when the test ends, or skips the test when not root.
func newNetns(t testing.TB, suffix string) string {
	t.Helper()
	return netnstest.New(t, "vpnft-"+suffix, "nft")
}

// kernelProxier returns a quiet proxier with the base options over the
// kernel of network namespace ns.
func kernelProxier(tb testing.TB, ns string) *Proxier {
	tb.Helper()
	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	p, err := New(o, &NFT{Netns: ns})
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func nsNft(t testing.TB, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// countingTransport counts Runs, remembers the last transaction and, when
// poison is set, appends a rule the kernel refuses (a jump to a chain that
// does not exist) so the whole transaction fails.
type countingTransport struct {
	Transport
	runs   int
	last   string
	poison bool
}

func (c *countingTransport) Run(ctx context.Context, tx *knftables.Transaction) error {
	c.runs++
	if c.poison {
		tx.Add(&knftables.Rule{Family: knftables.IPv4Family, Table: TableName, Chain: chainServices, Rule: "jump no-such-chain"})
	}
	c.last = tx.String()
	return c.Transport.Run(ctx, tx)
}

// allScenarioPorts merges every behaviour scenario's ports into one State
// (later duplicates of a name are dropped).
func allScenarioPorts() *model.State { return dataplanetest.AllScenarioPorts() }

func TestKernel(t *testing.T) {
	ns := newNetns(t, "kernel")
	ctx := context.Background()
	// Someone else's table must survive everything.
	nsNft(t, ns, "add table ip other; add chain ip other c { type filter hook input priority 0 ; }; add rule ip other c tcp dport 22 accept")
	before := nsNft(t, ns, "list ruleset")

	tr := &countingTransport{Transport: &NFT{Netns: ns}}
	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	p, err := New(o, tr)
	if err != nil {
		t.Fatal(err)
	}
	stA := allScenarioPorts()
	if err := p.Sync(ctx, stA, true); err != nil {
		t.Fatalf("full sync: %v", err)
	}
	out := nsNft(t, ns, "list table ip vipproxy")
	for _, want := range []string{"chain nat-prerouting", "map service-ips", "10.96.0.10 . tcp . 80 : goto int-cluster-tcp-3", "numgen random mod 3 map @cluster-endpoints-tcp", "10.96.0.10 . 80 . 2 : 10.1.2.6 . 8080", "chain int-cluster-tcp-h251-observed {\n\t\tct event set new,destroy,assured", "chain svc-default/weighted/-/udp {\n\t\tct event set 0x0",
		"chain svc-default/rr/-/tcp {\n\t\tct event set destroy\n\t\tlimit rate 10/second burst 10 packets ct event set new,destroy,assured\n\t\tnumgen random mod 8 0 ct event set new,destroy,assured\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("ip vipproxy lacks %q", want)
		}
	}
	nsNft(t, ns, "list table ip6 vipproxy")
	if rs := nsNft(t, ns, "list tables"); !strings.Contains(rs, "table ip other") {
		t.Errorf("tables after start:\n%s", rs)
	}

	// Partial sync: one endpoint changed; same State again sends nothing.
	stB := allScenarioPorts()
	stB.Ports[0].Endpoints = append(stB.Ports[0].Endpoints, dataplanetest.EP("10.1.2.250", 8080, false))
	dataplanetest.Fill(stB.Ports[0])
	runs := tr.runs
	if err := p.Sync(ctx, stB, false); err != nil {
		t.Fatalf("partial sync: %v", err)
	}
	if err := p.Sync(ctx, stB, false); err != nil {
		t.Fatalf("partial sync (same): %v", err)
	}
	if tr.runs != runs+1 {
		t.Errorf("two partial syncs of one change ran %d transactions, want 1", tr.runs-runs)
	}
	if !strings.Contains(nsNft(t, ns, "list table ip vipproxy"), "10.1.2.250") {
		t.Errorf("partial sync did not add the new endpoint")
	}
	// Back to A (removes the endpoint; removed chains are deleted one sync later).
	for i := 0; i < 2; i++ {
		if err := p.Sync(ctx, stA, false); err != nil {
			t.Fatalf("partial sync back to A: %v", err)
		}
	}
	if strings.Contains(nsNft(t, ns, "list table ip vipproxy"), "10.1.2.250") {
		t.Errorf("endpoint still programmed after it was removed")
	}

	// Deleted behind our back: the next (partial) sync restores it.
	nsNft(t, ns, "delete table ip vipproxy")
	if err := p.Sync(ctx, stA, false); err != nil {
		t.Fatalf("sync after delete: %v", err)
	}
	if !strings.Contains(nsNft(t, ns, "list table ip vipproxy"), "jump services") {
		t.Errorf("table not restored after delete")
	}
	// Flushed behind our back: same.
	nsNft(t, ns, "flush table ip6 vipproxy")
	if err := p.Sync(ctx, stA, false); err != nil {
		t.Fatalf("sync after flush: %v", err)
	}
	if !strings.Contains(nsNft(t, ns, "list table ip6 vipproxy"), "jump services") {
		t.Errorf("table not restored after flush")
	}
	// A periodic full sync on an intact table works too.
	if err := p.Sync(ctx, stB, true); err != nil {
		t.Fatalf("full sync: %v", err)
	}

	// A transaction the kernel refuses leaves the previous rules in force,
	// is counted, and makes the next sync full.
	good := nsNft(t, ns, "list table ip vipproxy")
	failures := counterValue(t, metrics.NFTablesSyncFailures)
	tr.poison = true
	if err := p.Sync(ctx, stA, false); err == nil {
		t.Fatalf("poisoned sync succeeded")
	}
	tr.poison = false
	if got := nsNft(t, ns, "list table ip vipproxy"); got != good {
		t.Errorf("failed transaction changed the table:\n--- before\n%s\n--- after\n%s", good, got)
	}
	if got := counterValue(t, metrics.NFTablesSyncFailures); got != failures+1 {
		t.Errorf("NFTablesSyncFailures = %v, want %v", got, failures+1)
	}
	if err := p.Sync(ctx, stA, false); err != nil {
		t.Fatalf("sync after failure: %v", err)
	}
	if !strings.Contains(tr.last, "delete table ip vipproxy") {
		t.Errorf("sync after a failure was not a rebuild")
	}

	if err := p.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if after := nsNft(t, ns, "list ruleset"); after != before {
		t.Errorf("ruleset after Cleanup differs:\n--- before\n%s\n--- after\n%s", before, after)
	}
	if err := p.Cleanup(ctx); err != nil {
		t.Fatalf("second Cleanup: %v", err)
	}
}

func counterValue(t testing.TB, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
