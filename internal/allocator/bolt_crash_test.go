package allocator

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

const crashEnv = "VIPPROXY_ALLOCATOR_CRASH_DB"

var crashCIDR = netip.MustParsePrefix("10.100.0.0/16")

// TestBoltCrashHelper is the child of TestBoltKill9: it assigns Services
// as fast as it can and prints each one after Assign returned (that is,
// after the bbolt transaction committed), until it is killed.
func TestBoltCrashHelper(t *testing.T) {
	path := os.Getenv(crashEnv)
	if path == "" {
		t.Skip("helper process for TestBoltKill9")
	}
	start, _ := strconv.Atoi(os.Getenv(crashEnv + "_START"))
	store, err := OpenBolt(path)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	a, err := NewAssigner(AssignerOptions{Store: store, ServiceCIDRs: []netip.Prefix{crashCIDR}, StaticSubrange: true})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	ctx := context.Background()
	w := bufio.NewWriter(os.Stdout)
	for i := start; i < start+100000; i++ {
		svc := model.Service{ServiceName: model.ServiceName{Namespace: "burst", Name: "s" + strconv.Itoa(i)}, Type: model.TypeNodePort,
			Ports: []model.ServicePortSpec{{Name: "p", Protocol: model.TCP, Port: 80}}}
		if i%3 == 0 {
			svc.Type = model.TypeClusterIP
		}
		got, err := a.Assign(ctx, svc)
		if err != nil {
			// The NodePort range runs out long before the IPs; keep going with ClusterIPs.
			svc.Type = model.TypeClusterIP
			if got, err = a.Assign(ctx, svc); err != nil {
				fmt.Fprintln(w, "error", err)
				w.Flush()
				os.Exit(2)
			}
		}
		fmt.Fprintf(w, "ok %s %s %d\n", got.ServiceName, got.ClusterIPs[0], got.Ports[0].NodePort)
		w.Flush()
	}
	os.Exit(0)
}

type committed struct {
	ip   netip.Addr
	port uint16
}

// runCrashChild starts the helper, lets it commit at least n Services,
// kills it with SIGKILL and returns every Service it reported committed.
func runCrashChild(t *testing.T, path string, start, n int) map[model.ServiceName]committed {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBoltCrashHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnv+"="+path, crashEnv+"_START="+strconv.Itoa(start))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	got := map[model.ServiceName]committed{}
	sc := bufio.NewScanner(out)
	timeout := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	defer timeout.Stop()
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] == "PASS" || f[0] == "ok" && len(f) != 4 {
			continue
		}
		if f[0] != "ok" {
			t.Fatalf("helper: %s", sc.Text())
		}
		ns, name, _ := strings.Cut(f[1], "/")
		port, _ := strconv.Atoi(f[3])
		got[model.ServiceName{Namespace: ns, Name: name}] = committed{netip.MustParseAddr(f[2]), uint16(port)}
		if len(got) == n && !killed {
			// Mid-burst: the helper is inside its next Assign right now.
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	err = cmd.Wait()
	if !killed {
		t.Fatalf("helper exited before %d commits (got %d): %v", n, len(got), err)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper was not killed by SIGKILL: %v", cmd.ProcessState)
	}
	return got
}

// TestBoltKill9 kills an allocating process with SIGKILL mid-burst, twice,
// and checks the reopened file: every allocation reported committed is
// there with its values, and no IP or port has two owners.
func TestBoltKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns helper processes")
	}
	path := filepath.Join(t.TempDir(), "state", DefaultStateFile)
	all := map[model.ServiceName]committed{}
	start := 0
	for round, n := range []int{400, 250} {
		got := runCrashChild(t, path, start, n)
		for k, v := range got {
			all[k] = v
		}
		start += len(got) + 1000 // the next child starts on fresh names
		store, err := OpenBolt(path)
		if err != nil {
			t.Fatalf("round %d: reopen after kill -9: %v", round, err)
		}
		m, err := store.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if m.Len() < len(all) || m.Len() > len(all)+1 {
			t.Errorf("round %d: map holds %d records, %d were reported committed (at most one more may have landed unreported)", round, m.Len(), len(all))
		}
		for name, want := range all {
			r, ok := m.Get(name)
			if !ok {
				t.Fatalf("round %d: committed allocation of %v lost", round, name)
			}
			if r.ClusterIPs[0] != want.ip || want.port != 0 && (len(r.NodePorts) != 1 || r.NodePorts[0].NodePort != want.port) {
				t.Fatalf("round %d: %v has %+v after restart, reported %v/%d", round, name, r, want.ip, want.port)
			}
		}
		ipOwner, portOwner := map[netip.Addr]model.ServiceName{}, map[uint16]model.ServiceName{}
		m.Range(func(n model.ServiceName, r Record) bool {
			for _, ip := range r.ClusterIPs {
				if o, dup := ipOwner[ip]; dup {
					t.Errorf("round %d: %v given to %v and %v", round, ip, o, n)
				}
				ipOwner[ip] = n
			}
			for _, p := range r.Ports() {
				if o, dup := portOwner[p]; dup {
					t.Errorf("round %d: port %d given to %v and %v", round, p, o, n)
				}
				portOwner[p] = n
			}
			return true
		})
		// The reopened store keeps working and keeps values.
		a := newAssignerT(t, store, crashCIDR)
		for name, want := range all {
			svc := model.Service{ServiceName: name, Type: model.TypeClusterIP, Ports: []model.ServicePortSpec{{Name: "p", Protocol: model.TCP, Port: 80}}}
			if want.port != 0 {
				svc.Type = model.TypeNodePort
			}
			got, err := a.Assign(context.Background(), svc)
			if err != nil || got.ClusterIPs[0] != want.ip || got.Ports[0].NodePort != want.port {
				t.Fatalf("round %d: re-Assign %v = %v/%d, %v; want %v/%d", round, name, got.ClusterIPs, got.Ports[0].NodePort, err, want.ip, want.port)
			}
			break // one is enough here; the map check above covers the rest
		}
		t.Logf("round %d: killed after %d commits; map has %d records at revision %d", round, len(got), m.Len(), m.Revision())
		store.Close()
	}
}
