//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Scenario 11: vipproxy is SIGKILLed and restarted while 50 TCP streams run
// through a ClusterIP: every stream completes byte-exact and every new
// connection made while it is down (and while it restarts) succeeds.
func TestRestartUnderLoad(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Before: func(b *bed) {
			svc := Service("stream", "10.96.0.110", Port("http", TCP, 80, 8080))
			b.apply("stream.yaml", svc, Slice(svc, V4, "a", allEPs(b.Topology)...))
		}})
		srcs := []string{b.Pod("pod1a").NS, b.Pod("pod1b").NS} // DNAT on node1
		for _, ns := range srcs {
			b.ready(ns, "tcp", "10.96.0.110:80")
		}
		if mode.Userspace {
			// Connections live in the proxy process and die with it; what
			// can be asked is that service resumes promptly.
			if !b.vp[0].Kill() {
				t.Fatal("vipproxy did not exit after SIGKILL")
			}
			if err := b.vp[0].Start(); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			for _, ns := range srcs {
				b.waitFor(ns, "tcp", "10.96.0.110:80", 5*time.Second, nil)
			}
			t.Logf("userspace: service answered again %v after restart; streams across SIGKILL are not possible in this mode", time.Since(start))
			return
		}
		const streams, chunks, chunkSize = 50, 40, 1024
		var wg sync.WaitGroup
		errs := make(chan error, streams)
		for i := 0; i < streams; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- stream(srcs[i%2], "10.96.0.110:80", uint64(i), chunks, chunkSize, 50*time.Millisecond)
			}()
		}
		// New connections while vipproxy is down and while it restarts.
		var tried, failed atomic.Int64
		var failures sync.Map
		stopDial := make(chan struct{})
		dialDone := make(chan struct{})
		go func() {
			defer close(dialDone)
			for i := 0; i < 400; i++ {
				select {
				case <-stopDial:
					return
				case <-time.After(25 * time.Millisecond):
				}
				tried.Add(1)
				if _, err := Dial(srcs[i%2], "tcp", "10.96.0.110:80"); err != nil {
					failed.Add(1)
					failures.Store(i, err.Error())
				}
			}
		}()
		time.Sleep(500 * time.Millisecond)
		vp := b.vp[0]
		oldPID := vp.PID()
		if !vp.Kill() {
			t.Fatal("vipproxy did not exit after SIGKILL")
		}
		t.Logf("SIGKILLed vipproxy pid %d on node1", oldPID)
		time.Sleep(time.Second)
		if err := vp.Start(); err != nil {
			t.Fatal(err)
		}
		restart := time.Now()
		if err := vp.WaitHealthy(20 * time.Second); err != nil {
			t.Fatal(err)
		}
		t.Logf("restarted as pid %d, healthy after %v", vp.PID(), time.Since(restart))
		time.Sleep(time.Second) // let the first full sync after restart land
		close(stopDial)
		<-dialDone
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		t.Logf("new connections during the outage and restart: %d tried, %d failed", tried.Load(), failed.Load())
		if failed.Load() > 0 || tried.Load() < 10 {
			n := 0
			failures.Range(func(k, v any) bool {
				if n < 5 {
					t.Errorf("new connection %v failed: %v", k, v)
				}
				n++
				return true
			})
			if tried.Load() < 10 {
				t.Errorf("only %d new connections tried", tried.Load())
			}
		}
	})
}

// stream opens a TCP connection through addr, sends chunks of random bytes
// with a pause between them, half-closes and checks that the echo is exact.
// It is bounded by a 30 s deadline.
func stream(ns, addr string, seed uint64, chunks, size int, pause time.Duration) error {
	c, err := DialConn(ns, "tcp", addr, DialOptions{Timeout: 2 * time.Second})
	if err != nil {
		return fmt.Errorf("stream %d: dial: %w", seed, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	if _, err := br.ReadString('\n'); err != nil {
		return fmt.Errorf("stream %d: reply line: %w", seed, err)
	}
	rng := rand.New(rand.NewPCG(seed, 42))
	sent := make([]byte, chunks*size)
	for i := range sent {
		sent[i] = byte(rng.Uint32())
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(br)
		got <- b
	}()
	for i := 0; i < chunks; i++ {
		if _, err := c.Write(sent[i*size : (i+1)*size]); err != nil {
			return fmt.Errorf("stream %d: write chunk %d: %w", seed, i, err)
		}
		time.Sleep(pause)
	}
	c.(*net.TCPConn).CloseWrite()
	echo := <-got
	if !bytes.Equal(echo, sent) {
		return fmt.Errorf("stream %d: echoed %d bytes, sent %d; equal prefix %d", seed, len(echo), len(sent), commonPrefix(echo, sent))
	}
	return nil
}

func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// Scenario 12: someone deletes or flushes vipproxy's rules; service is back
// within one syncPeriod (2 s here, plus 1 s of slack for the probe).
func TestRulesRestored(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		if len(mode.Tamper) == 0 {
			t.Skipf("mode %s has no kernel rules to tamper with", mode.Name)
		}
		const syncPeriod = 2 * time.Second
		b := newBed(t, mode, bedOptions{Nodes: []int{1}, SyncPeriod: syncPeriod, Before: func(b *bed) {
			svc := Service("web", "10.96.0.120", Port("http", TCP, 80, 8080))
			svc.Spec.ClusterIPs = []string{"10.96.0.120", "fd00:96::78"}
			svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
			rds := corev1.IPFamilyPolicyRequireDualStack
			svc.Spec.IPFamilyPolicy = &rds
			var v6 []discoveryv1.Endpoint
			for _, p := range b.Pods() {
				v6 = append(v6, EP6(p))
			}
			b.apply("web.yaml", svc, Slice(svc, V4, "a", allEPs(b.Topology)...), Slice(svc, V6, "a", v6...))
		}})
		ns := b.Pod("pod1a").NS
		// Both families must come back, whichever one was damaged.
		probe := func() error {
			for _, addr := range []string{"10.96.0.120:80", "[fd00:96::78]:80"} {
				if _, err := DialWith(ns, "tcp", addr, DialOptions{Timeout: 200 * time.Millisecond}); err != nil {
					return err
				}
			}
			return nil
		}
		for _, cmd := range mode.Tamper {
			b.ready(ns, "tcp", "10.96.0.120:80")
			b.ready(ns, "tcp", "[fd00:96::78]:80")
			if _, err := Exec(b.node(1).NS, cmd...); err != nil {
				t.Fatalf("tamper: %v", err)
			}
			start := time.Now()
			brokeErr := probe()
			_, err := eventually(syncPeriod+2*time.Second, 50*time.Millisecond, probe)
			took := time.Since(start)
			if err != nil {
				t.Errorf("after %q: service not restored: %v", strings.Join(cmd, " "), err)
				continue
			}
			t.Logf("after %q: first probe err=%v; restored after %v", strings.Join(cmd, " "), brokeErr, took)
			if took > Scaled(syncPeriod+time.Second) {
				t.Errorf("after %q: restored after %v, want within one syncPeriod (%v + 1s slack)", strings.Join(cmd, " "), took, syncPeriod)
			}
		}
	})
}

// cleanupSysctls are the knobs vipproxy may change and --cleanup must restore.
var cleanupSysctls = []string{
	"net.ipv4.conf.all.route_localnet",
	"net.ipv4.conf.eth0.route_localnet",
	"net.ipv4.ip_forward",
	"net.ipv6.conf.all.forwarding",
	"net.netfilter.nf_conntrack_tcp_be_liberal",
	"net.ipv4.conf.all.arp_ignore",
	"net.ipv4.conf.all.arp_announce",
	// ipvs mode's (absent on kernels without IPVS; hack/vm-test.sh loads
	// ip_vs before the tests, as on a node that ran kube-proxy's ipvs mode).
	"net.ipv4.vs.conntrack",
	"net.ipv4.vs.expire_nodest_conn",
	"net.ipv4.vs.expire_quiescent_template",
}

// Knobs kube-proxy sets at start and never reverts; differences are logged.
var infoSysctls = []string{
	"net.netfilter.nf_conntrack_tcp_timeout_established",
	"net.netfilter.nf_conntrack_tcp_timeout_close_wait",
}

func readSysctls(t *testing.T, ns string, keys []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, k := range keys {
		out, err := Exec(ns, "sysctl", "-n", k)
		if err != nil {
			m[k] = "(absent)"
			continue
		}
		m[k] = strings.TrimSpace(out)
	}
	return m
}

// Scenario 13: `vipproxy --cleanup` returns the node's ruleset (including an
// unrelated table that must survive), addresses and routes to exactly what
// they were before vipproxy started, and succeeds again when there is nothing
// left.
func TestCleanupRestoresRuleset(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		var before string
		var sysBefore, infoBefore map[string]string
		b := newBed(t, mode, bedOptions{Nodes: []int{1}, Before: func(b *bed) {
			ns := b.node(1).NS
			if _, err := runInput([]byte(`
table inet bystander {
	chain input {
		type filter hook input priority 0; policy accept;
		tcp dport 9999 counter accept
	}
}
`), "ip", "netns", "exec", ns, "nft", "-f", "-"); err != nil {
				t.Fatal(err)
			}
			before = nodeState(t, ns)
			sysBefore = readSysctls(t, ns, cleanupSysctls)
			infoBefore = readSysctls(t, ns, infoSysctls)
			svc := Service("web", "10.96.0.130", Port("http", TCP, 80, 8080), Port("dns", UDP, 80, 8080))
			svc.Spec.Type = "NodePort"
			svc.Spec.Ports[0].NodePort = 30130
			svc.Spec.Ports[1].NodePort = 30130
			none := Service("none", "10.96.0.131", Port("http", TCP, 80, 8080))
			b.apply("web.yaml", svc, Slice(svc, V4, "a", allEPs(b.Topology)...), none)
		}})
		node := b.node(1)
		b.ready(b.Pod("pod1a").NS, "tcp", "10.96.0.130:80")
		b.ready(b.Client, "tcp", vip(node.IPv4, 30130))
		during := nodeState(t, node.NS)
		if during == before {
			t.Fatalf("ruleset, addresses and routes unchanged while vipproxy runs; the test would prove nothing")
		}
		// A crash leaves everything in place; --cleanup must remove it.
		if !b.vp[0].Kill() {
			t.Fatal("vipproxy did not exit after SIGKILL")
		}
		// --state-dir lets --cleanup find the journal of changed sysctls.
		out, err := RunCleanup(t, node, mode.proxy(), "--state-dir", b.vp[0].StateDir())
		if err != nil {
			t.Fatalf("--cleanup: %v\n%s", err, out)
		}
		after := nodeState(t, node.NS)
		if after != before {
			t.Errorf("node state after --cleanup differs from before start:\n%s", lineDiff(before, after))
		}
		if got := readSysctls(t, node.NS, cleanupSysctls); fmt.Sprint(got) != fmt.Sprint(sysBefore) {
			t.Errorf("sysctls after --cleanup: %v, before start: %v", got, sysBefore)
		}
		// Unlike kube-proxy, vipproxy journals the conntrack settings it
		// changed and --cleanup puts them back.
		if got := readSysctls(t, node.NS, infoSysctls); fmt.Sprint(got) != fmt.Sprint(infoBefore) {
			t.Errorf("conntrack sysctls after --cleanup: %v, before start: %v", got, infoBefore)
		}
		if out, err := RunCleanup(t, node, mode.proxy()); err != nil {
			t.Errorf("second --cleanup (nothing to remove): %v\n%s", err, out)
		}
		if _, err := Dial(b.Pod("pod1a").NS, "tcp", "10.96.0.130:80"); err == nil {
			t.Errorf("ClusterIP still answers after --cleanup")
		}
	})
}

// Scenario 15: a malformed file and an invalid Service arrive while vipproxy
// runs. The other Services keep answering throughout, a Service added later
// (and a valid sibling in the same file as the invalid one) still gets
// programmed, and the log names the file and the field.
func TestBadInputWhileRunning(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Nodes: []int{1}, Before: func(b *bed) {
			svc := Service("good", "10.96.0.150", Port("http", TCP, 80, 8080))
			b.apply("good.yaml", svc, Slice(svc, V4, "a", allEPs(b.Topology)...))
		}})
		ns := b.Pod("pod1a").NS
		b.ready(ns, "tcp", "10.96.0.150:80")

		var tried, failed atomic.Int64
		var firstErr atomic.Value
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; i < 300; i++ { // at most 300 × ≥100 ms
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				tried.Add(1)
				if _, err := DialWith(ns, "tcp", "10.96.0.150:80", DialOptions{Timeout: 500 * time.Millisecond}); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()

		b.apply("broken.yaml", "apiVersion: v1\nkind: Service\nmetadata:\n  name: broken\n spec: [ports\n")
		bad := Service("invalid", "10.96.0.999", Port("http", TCP, 80, 8080))
		sibling := Service("sibling", "10.96.0.152", Port("http", TCP, 80, 8080))
		b.apply("invalid.yaml", bad, Slice(bad, V4, "a", allEPs(b.Topology)...), sibling, Slice(sibling, V4, "a", allEPs(b.Topology)...))
		time.Sleep(500 * time.Millisecond)
		later := Service("later", "10.96.0.151", Port("http", TCP, 80, 8080))
		b.apply("later.yaml", later, Slice(later, V4, "a", allEPs(b.Topology)...))
		b.waitFor(ns, "tcp", "10.96.0.151:80", 5*time.Second, nil)
		b.waitFor(ns, "tcp", "10.96.0.152:80", 5*time.Second, nil)
		time.Sleep(2 * time.Second) // across a periodic full sync
		close(stop)
		<-done
		if failed.Load() > 0 || tried.Load() < 10 {
			t.Errorf("good Service during bad input: %d of %d probes failed (first: %v)", failed.Load(), tried.Load(), firstErr.Load())
		}
		if !b.vp[0].Running() {
			t.Fatalf("vipproxy exited on bad input")
		}
		log := b.vp[0].Log()
		for _, want := range [][]string{
			{"broken.yaml", "line"}, // a YAML syntax error names its line
			{"invalid.yaml", "clusterIP", "10.96.0.999"},
		} {
			if line, ok := logLine(log, want...); !ok {
				t.Errorf("log has no line naming all of %q", want)
			} else {
				t.Logf("log: %s", line)
			}
		}
	})
}

// logLine returns the first line of log that contains every word
// (case-insensitively).
func logLine(log string, words ...string) (string, bool) {
	for _, line := range strings.Split(log, "\n") {
		low := strings.ToLower(line)
		ok := true
		for _, w := range words {
			if !strings.Contains(low, strings.ToLower(w)) {
				ok = false
				break
			}
		}
		if ok {
			return line, true
		}
	}
	return "", false
}

// nodeState is what --cleanup must restore in a node namespace: the nft
// ruleset (which holds iptables-nft rules too), addresses and routes.
func nodeState(t *testing.T, ns string) string {
	t.Helper()
	var sb strings.Builder
	sb.WriteString("# nft list ruleset\n" + dumpRules(t, ns))
	for _, args := range [][]string{
		{"ip", "-o", "addr", "show"},
		{"ip", "-4", "route", "show", "table", "all"},
		{"ip", "-6", "route", "show", "table", "all"},
	} {
		out, err := Exec(ns, args...)
		if err != nil {
			t.Fatalf("node state: %v", err)
		}
		sb.WriteString("# " + strings.Join(args, " ") + "\n" + out)
	}
	for _, save := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		if _, err := execLookPath(save); err == nil {
			out, _ := Exec(ns, save)
			sb.WriteString("# " + save + "\n" + legacyRules(out))
		}
	}
	if _, err := execLookPath("ipset"); err == nil {
		// The iptables mode's hairpin sets, the IPVS mode's sets.
		out, _ := Exec(ns, "ipset", "list", "-n")
		names := strings.Fields(out)
		slices.Sort(names)
		sb.WriteString("# ipset list -n\n" + strings.Join(names, "\n") + "\n")
	}
	return sb.String()
}

// legacyRules keeps, from iptables-legacy-save output, the rules and the
// user chains, each prefixed by its table: the legacy backend cannot
// remove a table once used, so empty built-in chains are not state.
func legacyRules(save string) string {
	var sb strings.Builder
	table := ""
	for _, l := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case strings.HasPrefix(l, "-A "):
			sb.WriteString(table + " " + l + "\n")
		case strings.HasPrefix(l, ":"):
			if f := strings.Fields(l); len(f) >= 2 && f[1] == "-" {
				sb.WriteString(table + " " + f[0] + "\n")
			}
		}
	}
	return sb.String()
}

// lineDiff lists the lines only in a ("-") and only in b ("+").
func lineDiff(a, b string) string {
	count := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(b, "\n") {
		count[l]--
	}
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if count[l] > 0 {
			out = append(out, "- "+l)
			count[l]--
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if count[l] < 0 {
			out = append(out, "+ "+l)
			count[l]++
		}
	}
	return strings.Join(out, "\n")
}
