//go:build linux

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	buildDir  string
	binPath   string
	buildErr  error
	buildSkip string
)

// SetBuildDir sets where Binary builds vipproxy (TestMain passes a temporary
// directory it removes at exit).
func SetBuildDir(dir string) { buildDir = dir }

// Scaled stretches a wait by $VIPPROXY_E2E_TIME_SCALE (an integer, default
// 1): the QEMU guests of hack/vm.sh emulate the CPU and run everything
// several times slower, and waits sized for a real CPU would fail there
// for no fault of vipproxy.
func Scaled(d time.Duration) time.Duration {
	if n, err := strconv.Atoi(os.Getenv("VIPPROXY_E2E_TIME_SCALE")); err == nil && n > 1 {
		return d * time.Duration(n)
	}
	return d
}

// Binary returns the path of the vipproxy binary, building ./cmd/vipproxy once
// per test process (or using $VIPPROXY_E2E_BINARY). It skips the test when the
// command does not exist yet and fails it when the build fails.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if p := os.Getenv("VIPPROXY_E2E_BINARY"); p != "" {
			binPath = p
			return
		}
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		if _, err := os.Stat(filepath.Join(root, "cmd", "vipproxy")); err != nil {
			buildSkip = "e2e: ./cmd/vipproxy does not exist yet: " + err.Error()
			return
		}
		dir := buildDir
		if dir == "" {
			dir = os.TempDir()
		}
		binPath = filepath.Join(dir, "vipproxy")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool(), "build", "-o", binPath, "./cmd/vipproxy")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/vipproxy: %w\n%s", err, out)
		}
	})
	if buildSkip != "" {
		t.Skip(buildSkip)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

func moduleRoot() (string, error) {
	out, err := exec.Command(goTool(), "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("e2e: not inside the vipproxy module")
	}
	return filepath.Dir(mod), nil
}

// Health and metrics addresses vipproxy binds inside its node namespace.
const (
	HealthzAddr = "127.0.0.1:10256"
	MetricsAddr = "127.0.0.1:10249"
)

// VipproxyOptions configure one vipproxy process. Zero values: SyncPeriod 2 s,
// MinSyncPeriod 0, no extra arguments.
type VipproxyOptions struct {
	Mode          string // --proxy-mode (required)
	Manifests     string // --manifests directory (required)
	SyncPeriod    time.Duration
	MinSyncPeriod time.Duration
	ExtraArgs     []string
	// Binary, if set, replaces the built vipproxy (self-tests of the bed).
	Binary string
	// DefaultNodePortAddresses omits --nodeport-addresses (normally the LAN
	// CIDRs) so vipproxy uses its default, the node's primary IPs.
	DefaultNodePortAddresses bool
	// NoClusterCIDR omits --cluster-cidr (no local-traffic detection).
	NoClusterCIDR bool
}

// Vipproxy is a vipproxy process running in a node namespace via
// `ip netns exec` (a Process). Its stdout and stderr go to LogPath across
// restarts; the log's tail is printed when the test fails.
type Vipproxy struct {
	Node    *Node
	Args    []string // arguments after the binary
	LogPath string
	t       testing.TB
	bin     string
	proc    Process
}

// StartVipproxy starts vipproxy in node's namespace and waits (up to 20 s) for
// /healthz to answer 200. It fails the test if either step fails. The process
// is killed by PID in t.Cleanup (and by Topology.Cleanup).
func (topo *Topology) StartVipproxy(node *Node, o VipproxyOptions) *Vipproxy {
	topo.t.Helper()
	v := topo.NewVipproxy(node, o)
	if err := v.Start(); err != nil {
		topo.t.Fatal(err)
	}
	if err := v.WaitHealthy(20 * time.Second); err != nil {
		topo.t.Fatalf("%v\nlog:\n%s", err, tail(v.Log(), 80))
	}
	return v
}

// NewVipproxy prepares (but does not start) a vipproxy for node: arguments
// from o per the CLI contract, a state directory and a log file in t.TempDir.
// It registers a t.Cleanup that kills the process and, if the test failed,
// prints the log's tail. It must be called from the test's goroutine.
func (topo *Topology) NewVipproxy(node *Node, o VipproxyOptions) *Vipproxy {
	t := topo.t
	t.Helper()
	bin := o.Binary
	if bin == "" {
		bin = Binary(t)
	}
	if o.SyncPeriod == 0 {
		o.SyncPeriod = 2 * time.Second
	}
	dir := t.TempDir()
	args := []string{
		"--manifests", o.Manifests,
		"--state-dir", filepath.Join(dir, "state"),
		"--hostname-override", node.Name,
		"--proxy-mode", o.Mode,
		"--service-cluster-ip-range", ServiceCIDR4 + "," + ServiceCIDR6,
		"--healthz-bind-address", HealthzAddr,
		"--metrics-bind-address", MetricsAddr,
		"--iptables-sync-period", o.SyncPeriod.String(),
		"--iptables-min-sync-period", o.MinSyncPeriod.String(),
		"-v", "2",
	}
	if !o.NoClusterCIDR {
		args = append(args, "--cluster-cidr", ClusterCIDR4+","+ClusterCIDR6)
	}
	if !o.DefaultNodePortAddresses {
		args = append(args, "--nodeport-addresses", LANCIDR4+","+LANCIDR6)
	}
	if o.Mode == "ipvs" {
		// kube-proxy's ipvs mode has its own sync-period flags (also used
		// when it falls back to iptables).
		args = append(args,
			"--ipvs-sync-period", o.SyncPeriod.String(),
			"--ipvs-min-sync-period", o.MinSyncPeriod.String())
	}
	args = append(args, o.ExtraArgs...)
	v := &Vipproxy{Node: node, Args: args, LogPath: filepath.Join(dir, "vipproxy-"+node.Name+".log"), t: t, bin: bin}
	v.proc = Process{Name: "vipproxy on " + node.Name, NS: node.NS, LogPath: v.LogPath}
	topo.Track(&v.proc)
	t.Cleanup(func() {
		v.Kill()
		if t.Failed() {
			t.Logf("vipproxy on %s log (%s), last 150 lines:\n%s", node.Name, v.LogPath, tail(v.Log(), 150))
		}
	})
	return v
}

// Start (re)starts the process with the same arguments. It fails if the
// process is already running.
func (v *Vipproxy) Start() error {
	if v.proc.Running() {
		return fmt.Errorf("vipproxy on %s: already running (pid %d)", v.Node.Name, v.proc.PID())
	}
	v.proc.Argv = append([]string{v.bin}, v.Args...)
	return v.proc.Start()
}

// PID returns the running process's PID, or 0.
func (v *Vipproxy) PID() int { return v.proc.PID() }

// Running reports whether the process has been started and not exited.
func (v *Vipproxy) Running() bool { return v.proc.Running() }

// Kill sends SIGKILL to the process (by PID) and waits (up to
// DefaultKillWait) until it has been reaped. It reports whether it was.
func (v *Vipproxy) Kill() bool { return v.proc.Kill() }

// Stop sends SIGTERM and waits up to 10 s, then SIGKILL. It returns the exit
// status of the process (nil for a clean exit).
func (v *Vipproxy) Stop() error {
	if !v.proc.Stop(10 * time.Second) {
		return fmt.Errorf("vipproxy on %s: did not exit within 10s of SIGTERM", v.Node.Name)
	}
	return v.proc.ExitErr()
}

// Log returns everything the process has written so far.
func (v *Vipproxy) Log() string { return v.proc.Log() }

// WaitHealthy polls /healthz until it answers 200, the process exits, or the
// timeout passes.
func (v *Vipproxy) WaitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(Scaled(timeout))
	var last error
	for time.Now().Before(deadline) {
		if !v.Running() {
			return fmt.Errorf("vipproxy on %s exited before becoming healthy: %v", v.Node.Name, v.proc.ExitErr())
		}
		code, body, err := HTTPGet(v.Node.NS, HealthzAddr, "/healthz")
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = fmt.Errorf("healthz: code %d body %q err %v", code, body, err)
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("vipproxy on %s not healthy within %v: %v", v.Node.Name, timeout, last)
}

// RunCleanup runs `vipproxy --cleanup --proxy-mode mode` in node's namespace
// and returns its output.
func RunCleanup(t testing.TB, node *Node, mode string, extra ...string) (string, error) {
	return Exec(node.NS, append([]string{Binary(t), "--cleanup", "--proxy-mode", mode}, extra...)...)
}

// StateDir returns the --state-dir v runs with ("" if none), where
// vipproxy journals the kernel parameters it changed.
func (v *Vipproxy) StateDir() string {
	for i, a := range v.Args {
		if a == "--state-dir" && i+1 < len(v.Args) {
			return v.Args[i+1]
		}
	}
	return ""
}

// HTTPGet fetches http://addr/path from inside namespace ns with a 2 s bound
// and returns the status code and body.
func HTTPGet(ns, addr, path string) (int, string, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			return DialConn(ns, network, a, DialOptions{Timeout: time.Second})
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, string(b), err
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
