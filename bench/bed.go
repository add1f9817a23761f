//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// Prefix starts the name of every network namespace the benchmark creates.
const Prefix = "vpbench-"

// Addresses of the bed. The node namespace (where the proxy runs and the
// client connects from) owns 10.244.0.1 on a veth into the pod namespace,
// which owns the real backends 10.244.0.10 … 10.244.0.(10+RealBackends-1)
// and treats every address of ServiceCIDR as local, so a connect to a VIP
// the proxy has not programmed yet is refused at once instead of timing out.
// The control namespace (Kubernetes mode) owns ControlIP on a veth into the
// node namespace; etcd and kube-apiserver run there.
const (
	NodeIP       = "10.244.0.1"
	ClusterCIDR  = "10.244.0.0/14"
	ServiceCIDR  = "10.96.0.0/15"
	NodeLinkIP   = "192.168.79.1"
	ControlIP    = "192.168.79.2"
	RealBackends = 10
	BackendPort  = 8080
	DeadPort     = 8089 // a backend port nothing listens on: connects are refused
	NodeName     = "bench-node"
)

// RealBackendIP returns the address of real backend i (0-based).
func RealBackendIP(i int) string { return fmt.Sprintf("10.244.0.%d", 10+i%RealBackends) }

// Bed is one measurement's namespaces: node, pod and optionally a link to a
// control namespace that outlives it. Close removes what it created.
type Bed struct {
	Node string
	Pod  string

	backend *e2e.Backend
	dialer  *Dialer
	links   []string
}

var nsSeq struct {
	sync.Mutex
	n int
}

// NSName returns a fresh namespace name with the benchmark's prefix, this
// process's PID and a role.
func NSName(role string) string {
	nsSeq.Lock()
	defer nsSeq.Unlock()
	nsSeq.n++
	return fmt.Sprintf("%s%d-%d-%s", Prefix, os.Getpid(), nsSeq.n, role)
}

func run(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func runAll(cmds [][]string) error {
	for _, c := range cmds {
		if err := run(c...); err != nil {
			return err
		}
	}
	return nil
}

// NewBed creates the node and pod namespaces, starts the real backends and
// the node namespace's dialer. control, if non-empty, is a namespace that
// already exists (see NewControlNS); the node gets a veth to it.
func NewBed(control string) (b *Bed, err error) {
	b = &Bed{Node: NSName("node"), Pod: NSName("pod")}
	defer func() {
		if err != nil {
			b.Close()
		}
	}()
	if err := runAll([][]string{
		{"ip", "netns", "add", b.Node},
		{"ip", "netns", "add", b.Pod},
	}); err != nil {
		return b, fmt.Errorf("bed: %w", err)
	}
	id := fmt.Sprintf("%x", time.Now().UnixNano()&0xffffff)
	np, pn := "vpbn"+id, "vpbp"+id
	cmds := [][]string{
		{"ip", "-n", b.Node, "link", "set", "lo", "up"},
		{"ip", "-n", b.Pod, "link", "set", "lo", "up"},
		{"ip", "link", "add", np, "netns", b.Node, "type", "veth", "peer", "name", pn, "netns", b.Pod},
		{"ip", "-n", b.Node, "addr", "add", NodeIP + "/24", "dev", np},
		{"ip", "-n", b.Node, "link", "set", np, "up"},
		{"ip", "-n", b.Pod, "link", "set", pn, "up"},
	}
	for i := 0; i < RealBackends; i++ {
		cmds = append(cmds, []string{"ip", "-n", b.Pod, "addr", "add", RealBackendIP(i) + "/24", "dev", pn})
	}
	cmds = append(cmds,
		// The node's default route points into the pod network, as in
		// hack/demo.sh; the pod network answers for every ClusterIP.
		[]string{"ip", "-n", b.Node, "route", "add", "default", "via", RealBackendIP(0)},
		[]string{"ip", "-n", b.Pod, "route", "add", "local", ServiceCIDR, "dev", "lo"},
		[]string{"ip", "-n", b.Pod, "route", "add", "default", "via", NodeIP},
	)
	if control != "" {
		nc, cn := "vpbc"+id, "vpbk"+id
		b.links = append(b.links, nc)
		cmds = append(cmds,
			[]string{"ip", "link", "add", nc, "netns", b.Node, "type", "veth", "peer", "name", cn, "netns", control},
			[]string{"ip", "-n", b.Node, "addr", "add", NodeLinkIP + "/30", "dev", nc},
			[]string{"ip", "-n", control, "addr", "add", ControlIP + "/30", "dev", cn},
			[]string{"ip", "-n", b.Node, "link", "set", nc, "up"},
			[]string{"ip", "-n", control, "link", "set", cn, "up"},
		)
	}
	if err := runAll(cmds); err != nil {
		return b, fmt.Errorf("bed: %w", err)
	}
	if b.backend, err = e2e.StartBackend(b.Pod, "pod", []int{BackendPort}, nil); err != nil {
		return b, fmt.Errorf("bed: backends: %w", err)
	}
	if b.dialer, err = NewDialer(b.Node); err != nil {
		return b, fmt.Errorf("bed: %w", err)
	}
	return b, nil
}

// Dialer returns the node namespace's dialer.
func (b *Bed) Dialer() *Dialer { return b.dialer }

// Close stops the backends and deletes the namespaces (which removes the
// veths and every rule programmed in them). It keeps going past errors.
func (b *Bed) Close() error {
	var errs []error
	if b.dialer != nil {
		b.dialer.Close()
	}
	if b.backend != nil {
		b.backend.Close()
	}
	for _, ns := range []string{b.Node, b.Pod} {
		if _, err := os.Stat("/run/netns/" + ns); err == nil {
			errs = append(errs, run("ip", "netns", "del", ns))
		}
	}
	return errors.Join(errs...)
}

// NewControlNS creates a namespace for the control plane.
func NewControlNS() (string, error) {
	ns := NSName("cp")
	if err := runAll([][]string{{"ip", "netns", "add", ns}, {"ip", "-n", ns, "link", "set", "lo", "up"}}); err != nil {
		return "", fmt.Errorf("control namespace: %w", err)
	}
	return ns, nil
}

// DeleteNS deletes a namespace this process created.
func DeleteNS(ns string) error {
	if !strings.HasPrefix(ns, Prefix) {
		return fmt.Errorf("netns %s: not ours", ns)
	}
	return run("ip", "netns", "del", ns)
}

// SweepOwn deletes every namespace named after this process (a last resort
// on exit).
func SweepOwn() { e2e.SweepOwnNetns(Prefix) }

// Dialer makes TCP connections from inside one namespace: one goroutine
// locked to an OS thread that joined the namespace serves every request, so
// a measured connect costs no thread creation or setns.
type Dialer struct {
	reqs chan dialReq
	once sync.Once
}

type dialReq struct {
	addr    string
	timeout time.Duration
	res     chan dialRes
}

type dialRes struct {
	conn net.Conn
	d    time.Duration
	err  error
}

// NewDialer starts a dialer in namespace ns.
func NewDialer(ns string) (*Dialer, error) {
	d := &Dialer{reqs: make(chan dialReq)}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the thread dies with the goroutine.
		h, err := netns.GetFromName(ns)
		if err != nil {
			errc <- fmt.Errorf("dialer: netns %s: %w", ns, err)
			return
		}
		err = netns.Set(h)
		h.Close()
		if err != nil {
			errc <- fmt.Errorf("dialer: enter netns %s: %w", ns, err)
			return
		}
		errc <- nil
		for r := range d.reqs {
			nd := net.Dialer{Timeout: r.timeout}
			start := time.Now()
			c, err := nd.Dial("tcp", r.addr)
			r.res <- dialRes{c, time.Since(start), err}
		}
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return d, nil
}

// Connect opens a TCP connection to addr, closes it and returns how long the
// connect took (socket to established).
func (d *Dialer) Connect(addr string, timeout time.Duration) (time.Duration, error) {
	c, took, err := d.Dial(addr, timeout)
	if err != nil {
		return took, err
	}
	c.Close()
	return took, nil
}

// Dial opens a TCP connection to addr from the dialer's namespace.
func (d *Dialer) Dial(addr string, timeout time.Duration) (net.Conn, time.Duration, error) {
	r := dialReq{addr: addr, timeout: timeout, res: make(chan dialRes, 1)}
	d.reqs <- r
	res := <-r.res
	return res.conn, res.d, res.err
}

// Close stops the dialer.
func (d *Dialer) Close() { d.once.Do(func() { close(d.reqs) }) }
