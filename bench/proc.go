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
	"syscall"
	"time"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// Proc is a command running inside a network namespace via `ip netns exec`
// (which execs, so the PID is the command's own), with stdout and stderr
// going to LogPath: an e2e.Process made by newProc.
type Proc = e2e.Process

// newProc returns an unstarted Proc named name that runs argv (binary and
// arguments) in namespace ns, logging to logPath with "bench" marker lines;
// Stop(grace) sends SIGTERM, then after grace SIGKILL and waits up to 30 s
// more.
func newProc(name, ns, logPath string, argv ...string) *Proc {
	return &Proc{Name: name, NS: ns, Argv: argv, LogPath: logPath, LogTag: "bench", KillWait: 30 * time.Second}
}

// Usage is a process's resident memory and consumed CPU time.
type Usage struct {
	RSS  uint64        // bytes (VmRSS)
	Peak uint64        // bytes (VmHWM: the largest RSS the process had)
	CPU  time.Duration // utime + stime + cutime + cstime (children it waited for: nft, iptables-restore)
}

// ReadUsage reads /proc/PID/status (VmRSS, VmHWM) and /proc/PID/stat (utime,
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
		if len(f) >= 2 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return u, fmt.Errorf("usage: VmHWM %q: %w", f[1], err)
			}
			u.Peak = kb * 1024
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

// startHog starts n busy-looping processes and returns the function that
// kills them, by PID, and waits for them. They die with the bench
// (Pdeathsig) and at the latest after limit. n ≤ 0 starts nothing.
func startHog(n int, limit time.Duration) (stop func(), err error) {
	var cmds []*exec.Cmd
	var timer *time.Timer
	stop = func() {
		if timer != nil {
			timer.Stop()
		}
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		cmds = nil
	}
	for range n {
		c := exec.Command("sh", "-c", "while :; do :; done")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("cpu hog: %w", err)
		}
		cmds = append(cmds, c)
	}
	if n > 0 {
		procs := make([]*os.Process, len(cmds))
		for i, c := range cmds {
			procs[i] = c.Process
		}
		timer = time.AfterFunc(limit, func() {
			for _, p := range procs {
				_ = p.Kill()
			}
		})
	}
	return stop, nil
}
