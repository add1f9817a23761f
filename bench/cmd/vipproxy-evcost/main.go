// Command vipproxy-evcost measures what a flow's conntrack event mask
// costs a TCP connect while a listener reads the events, as vipproxy's
// outlier ejection does: one rule-set, one run, every mask side by side.
//
// As root it creates a network namespace (removed at the end), gives each
// mask a VIP (10.96.0.1, .2, …) whose output-hook chain sets "ct event
// set MASK" and DNATs to a server on 10.0.0.1:8080 over loopback, and
// subscribes to the namespace's conntrack events, read every 20 ms
// without waiting on the socket (as vipproxy reads them). A client then
// connects n times, round-robin over the VIPs, and prints each mask's
// connect latency and the events read:
//
//	go run ./bench/cmd/vipproxy-evcost -masks 0x0,destroy,new,assured,new,destroy,assured -n 20000
//
// Masks are separated by ';' when one holds commas; the default compares
// the masks vipproxy uses. The numbers are relative: loopback, no veth.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netns"

	"github.com/vipproxy/vipproxy/internal/conntrack"
)

func main() {
	mode := flag.String("mode", "run", "run; serve and client are the child processes")
	masks := flag.String("masks", "0x0;destroy;new,destroy,assured;sampled", `';'-separated "ct event set" masks ("sampled": vipproxy's sampled flows, destroy, and new,destroy,assured for 10 flows a second and one in 8 beyond)`)
	n := flag.Int("n", 20000, "connects in all")
	vips := flag.String("vips", "", "client: the VIPs")
	flag.Parse()
	var err error
	switch *mode {
	case "serve":
		err = serve()
	case "client":
		err = client(strings.Split(*vips, ","), *n)
	default:
		err = run(strings.Split(*masks, ";"), *n)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "vipproxy-evcost:", err)
		os.Exit(1)
	}
}

// run sets up the namespace, the server and the listener, and runs the
// client.
func run(masks []string, n int) (err error) {
	ns := fmt.Sprintf("vpx-evcost-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add: %w: %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	inNS := func(args ...string) *exec.Cmd {
		return exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	}
	for _, c := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", "10.0.0.1/32", "dev", "lo"},
		{"ip", "route", "add", "10.96.0.0/16", "dev", "lo"},
		{"sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65000"},
	} {
		if out, err := inNS(c...).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %w: %s", c, err, out)
		}
	}
	var rules strings.Builder
	rules.WriteString("table ip evcost {\n  chain out {\n    type nat hook output priority -100\n")
	var addrs []string
	for i := range masks {
		vip := fmt.Sprintf("10.96.0.%d", i+1)
		addrs = append(addrs, vip+":80")
		fmt.Fprintf(&rules, "    ip daddr %s tcp dport 80 jump m%d\n", vip, i)
	}
	rules.WriteString("  }\n")
	for i, m := range masks {
		fmt.Fprintf(&rules, "  chain m%d {\n", i)
		if m == "sampled" {
			rules.WriteString("    ct event set destroy\n    limit rate 10/second burst 10 packets ct event set new,destroy,assured\n" +
				"    numgen random mod 8 0 ct event set new,destroy,assured\n")
		} else {
			fmt.Fprintf(&rules, "    ct event set %s\n", m)
		}
		rules.WriteString("    meta l4proto tcp dnat to 10.0.0.1:8080\n  }\n")
	}
	rules.WriteString("}\n")
	nft := inNS("nft", "-f", "-")
	nft.Stdin = strings.NewReader(rules.String())
	if out, err := nft.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %w: %s", err, out)
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	srv := inNS(self, "-mode", "serve")
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()

	h, err := netns.GetFromName(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	evs, err := conntrack.SubscribeEvents(int(h), 4<<20)
	if err != nil {
		return err
	}
	defer evs.Close()
	counts := make([]int, len(masks))
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			got, _ := evs.Poll()
			for _, e := range got {
				if i := slices.Index(addrs, e.Flow.OrigDst.String()); i >= 0 {
					counts[i]++
				}
			}
		}
	}()
	time.Sleep(300 * time.Millisecond) // the server listening
	cl := inNS(self, "-mode", "client", "-n", fmt.Sprint(n), "-vips", strings.Join(addrs, ","))
	out, err := cl.Output()
	time.Sleep(100 * time.Millisecond)
	close(stop)
	<-done
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	fmt.Printf("%-20s %10s %10s %10s %8s\n", "mask", "p50", "p90", "p99", "events")
	for i, m := range masks {
		fmt.Printf("%-20s %s %8d\n", m, lines[i], counts[i])
	}
	return nil
}

func serve() error {
	l, err := net.Listen("tcp", "10.0.0.1:8080")
	if err != nil {
		return err
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		c.Close()
	}
}

// client connects n times round-robin over vips and prints one line of
// latencies per VIP.
func client(vips []string, n int) error {
	lat := make([][]time.Duration, len(vips))
	for i := range n {
		t := i % len(vips)
		s := time.Now()
		c, err := net.Dial("tcp", vips[t])
		d := time.Since(s)
		if err != nil {
			return err
		}
		c.Close()
		lat[t] = append(lat[t], d)
	}
	for _, l := range lat {
		slices.Sort(l)
		q := func(f float64) string { return fmt.Sprintf("%8.1fµs", float64(l[int(f*float64(len(l)-1))])/1e3) }
		fmt.Printf("%s %s %s\n", q(0.5), q(0.9), q(0.99))
	}
	return nil
}
