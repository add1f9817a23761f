package allocator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/vipproxy/vipproxy/internal/model"
)

// testEtcd is a real single-member etcd server embedded in the test
// process, on 127.0.0.1 ports picked at random, with a temp data dir.
type testEtcd struct {
	t          testing.TB
	cfg        *embed.Config
	e          *embed.Etcd
	clientAddr string
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startTestEtcd(t *testing.T) *testEtcd { return startTestEtcdTB(t, false) }

// startTestEtcdTB starts the server; noFsync trades crash safety of the
// test server for speed (a graceful stop still persists everything).
func startTestEtcdTB(t testing.TB, noFsync bool) *testEtcd {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.UnsafeNoFsync = noFsync
	cfg.Name = "vipproxy-test"
	cfg.Dir = t.TempDir()
	cfg.LogLevel = "fatal"
	cfg.LogOutputs = []string{"stderr"}
	cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	te := &testEtcd{t: t, cfg: cfg, clientAddr: cu.Host}
	te.start()
	t.Cleanup(te.stop)
	return te
}

func (te *testEtcd) start() {
	te.t.Helper()
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		// The ports of a stopped server may linger for a moment.
		if te.e, err = embed.StartEtcd(te.cfg); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		te.t.Fatalf("start etcd: %v", err)
	}
	select {
	case <-te.e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		te.e.Close()
		te.t.Fatal("etcd did not become ready in 30s")
	}
}

func (te *testEtcd) stop() {
	if te.e != nil {
		te.e.Close()
		te.e = nil
	}
}

func openEtcdT(t *testing.T, te *testEtcd, prefix string) *EtcdStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := OpenEtcd(ctx, EtcdOptions{Endpoints: []string{te.clientAddr}, Prefix: prefix, AttemptTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestEtcdRaceForOneIP: eight hosts ask for the same fixed IP for eight
// different Services at once; exactly one gets it, the others are told
// who owns it.
func TestEtcdRaceForOneIP(t *testing.T) {
	te := startTestEtcd(t)
	ctx := context.Background()
	const hosts = 8
	var wg sync.WaitGroup
	errs := make([]error, hosts)
	start := make(chan struct{})
	for i := range hosts {
		a := newAssignerT(t, openEtcdT(t, te, "/race/"), v4CIDR)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = a.Assign(ctx, clusterIPSvc("race", fmt.Sprintf("s%d", i), "10.96.0.7"))
		}()
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Fatalf("both race/s%d and race/s%d got 10.96.0.7", winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatalf("nobody got the IP: %v", errs)
	}
	want := fmt.Sprintf("already allocated to race/s%d", winner)
	for i, err := range errs {
		if i != winner && (!errors.Is(err, ErrAllocated) || !strings.Contains(err.Error(), want)) {
			t.Errorf("loser s%d: %v, want ErrAllocated %q", i, err, want)
		}
	}
}

// TestEtcdConcurrentAssigners: 8 Assigners, each with its own etcd client
// (eight hosts), assign 500 Services each into one /20 at the same time,
// while etcd is stopped and restarted mid-run. Every Service gets an IP,
// no IP or NodePort is given twice, and every allocation is in the map.
func TestEtcdConcurrentAssigners(t *testing.T) {
	hosts, perHost := 8, 500
	if testing.Short() {
		perHost = 60
	}
	te := startTestEtcdTB(t, os.Getenv("VIPPROXY_ETCD_FSYNC") == "")
	cidr := netip.MustParsePrefix("10.128.0.0/20") // 4094 addresses for 4000 Services
	type result struct {
		name model.ServiceName
		ip   netip.Addr
		port uint16
	}
	results := make([][]result, hosts)
	errs := make([]error, hosts)
	var done atomic.Int64
	var wg sync.WaitGroup
	begin := time.Now()
	var stores []*EtcdStore
	for h := range hosts {
		store := openEtcdT(t, te, "/vipproxy/")
		stores = append(stores, store)
		a, err := NewAssigner(AssignerOptions{Store: store, ServiceCIDRs: []netip.Prefix{cidr}, StaticSubrange: true})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perHost {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				svc := clusterIPSvc(fmt.Sprintf("host%d", h), fmt.Sprintf("svc%d", i))
				if i%4 == 0 {
					svc.Type = model.TypeNodePort
				}
				got, err := a.Assign(ctx, svc)
				cancel()
				if err != nil {
					errs[h] = fmt.Errorf("host %d Service %d: %w", h, i, err)
					return
				}
				results[h] = append(results[h], result{got.ServiceName, got.ClusterIPs[0], got.Ports[0].NodePort})
				done.Add(1)
			}
		}()
	}
	// Restart etcd once a fifth of the work is done.
	restarted := make(chan time.Duration, 1)
	go func() {
		total := int64(hosts * perHost)
		for done.Load() < total/5 {
			time.Sleep(5 * time.Millisecond)
		}
		at := done.Load()
		t0 := time.Now()
		te.stop()
		stopped := time.Since(t0)
		time.Sleep(500 * time.Millisecond)
		te.start()
		ready := time.Now()
		atReady := done.Load()
		for done.Load() == atReady && time.Since(ready) < 30*time.Second {
			time.Sleep(time.Millisecond)
		}
		t.Logf("etcd stopped after %d of %d assignments (Close took %v, %d more finished during it); "+
			"restarted in %v; next assignment %v after it was ready",
			at, total, stopped.Round(time.Millisecond), atReady-at,
			ready.Sub(t0.Add(stopped+500*time.Millisecond)).Round(time.Millisecond), time.Since(ready).Round(time.Millisecond))
		restarted <- time.Since(begin)
	}()
	wg.Wait()
	elapsed := time.Since(begin)
	select {
	case <-restarted:
	case <-time.After(60 * time.Second):
		t.Fatal("etcd restart did not finish")
	}
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var attempts, conflicts int64
	for _, s := range stores {
		attempts += s.statAttempts.Load()
		conflicts += s.statConflicts.Load()
	}
	t.Logf("%d Assigns by %d hosts in %v (%.0f/s); %d etcd transactions, %d lost to a concurrent writer",
		hosts*perHost, hosts, elapsed.Round(time.Millisecond), float64(hosts*perHost)/elapsed.Seconds(), attempts, conflicts)

	ipOwner := map[netip.Addr]model.ServiceName{}
	portOwner := map[uint16]model.ServiceName{}
	for _, rs := range results {
		if len(rs) != perHost {
			t.Fatalf("a host finished %d of %d", len(rs), perHost)
		}
		for _, r := range rs {
			if o, dup := ipOwner[r.ip]; dup {
				t.Fatalf("%v given to %v and %v", r.ip, o, r.name)
			}
			ipOwner[r.ip] = r.name
			if r.port != 0 {
				if o, dup := portOwner[r.port]; dup {
					t.Fatalf("port %d given to %v and %v", r.port, o, r.name)
				}
				portOwner[r.port] = r.name
			}
		}
	}
	// A fresh client reads the map back: nothing lost, nothing extra.
	fresh := openEtcdT(t, te, "/vipproxy/")
	m, err := fresh.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if m.Len() != hosts*perHost {
		t.Fatalf("map holds %d records, want %d", m.Len(), hosts*perHost)
	}
	for _, rs := range results {
		for _, r := range rs {
			rec, ok := m.Get(r.name)
			if !ok || rec.ClusterIPs[0] != r.ip || r.port != 0 && rec.NodePorts[0].NodePort != r.port {
				t.Fatalf("%v: map has %+v (present %v), Assign returned %v/%d", r.name, rec, ok, r.ip, r.port)
			}
		}
	}
}
