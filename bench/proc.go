//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// Proc is a command running inside a network namespace via `ip netns exec`
// (which execs, so the PID is the command's own), with stdout and stderr
// going to LogPath.
type Proc struct {
	Name    string
	NS      string
	Argv    []string
	LogPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
	started time.Time
}

// Start starts the process and records the start time.
func (p *Proc) Start() error {
	f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: log: %w", p.Name, err)
	}
	fmt.Fprintf(f, "=== bench: start %s: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(p.Argv, " "))
	cmd := exec.Command("ip", append([]string{"netns", "exec", p.NS}, p.Argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	started := time.Now()
	if err := e2e.StartProcess(cmd); err != nil {
		f.Close()
		return fmt.Errorf("%s: start: %w", p.Name, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.started = cmd, done, started
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(f, "=== bench: exit %s: %v\n", time.Now().Format(time.RFC3339Nano), err)
		f.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Started returns when Start launched the process.
func (p *Proc) Started() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started
}

// PID returns the process ID (0 before Start).
func (p *Proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the process has been started and not exited.
func (p *Proc) Running() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// ExitErr returns the last run's exit status.
func (p *Proc) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Stop sends SIGTERM and waits up to grace, then SIGKILL and up to 30 s.
func (p *Proc) Stop(grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	for _, s := range []struct {
		sig  syscall.Signal
		wait time.Duration
	}{{syscall.SIGTERM, grace}, {syscall.SIGKILL, 30 * time.Second}} {
		select {
		case <-done:
			return
		default:
		}
		cmd.Process.Signal(s.sig)
		select {
		case <-done:
			return
		case <-time.After(s.wait):
		}
	}
}

// Tail returns the last n lines of the log.
func (p *Proc) Tail(n int) string {
	b, _ := os.ReadFile(p.LogPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Usage is a process's resident memory and consumed CPU time.
type Usage struct {
	RSS uint64        // bytes (VmRSS)
	CPU time.Duration // utime + stime + cutime + cstime (children it waited for: nft, iptables-restore)
}

// ReadUsage reads /proc/PID/status (VmRSS) and /proc/PID/stat (utime,
// stime, and cutime, cstime: the CPU of the nft / iptables-restore children
// a proxy runs is part of its cost) of a running process.
func ReadUsage(pid int) (Usage, error) {
	var u Usage
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, fmt.Errorf("usage: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	found := false
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return u, fmt.Errorf("usage: VmRSS %q: %w", f[1], err)
			}
			u.RSS, found = kb*1024, true
		}
	}
	if !found {
		return u, fmt.Errorf("usage: pid %d: no VmRSS", pid)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, fmt.Errorf("usage: %w", err)
	}
	// Fields after the command name (which may hold spaces) start at state.
	rest := string(stat)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	if len(f) < 15 {
		return u, fmt.Errorf("usage: pid %d: short stat", pid)
	}
	var ticks uint64
	for _, i := range []int{11, 12, 13, 14} { // fields 14-17 overall
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return u, fmt.Errorf("usage: pid %d: bad stat field %d %q", pid, i+3, f[i])
		}
		ticks += v
	}
	const hz = 100 // USER_HZ on Linux
	u.CPU = time.Duration(ticks) * time.Second / hz
	return u, nil
}
