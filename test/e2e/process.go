//go:build linux

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// spawner starts processes from one OS thread that lives as long as the test
// binary, so Pdeathsig (SIGKILL to children when that thread dies) fires only
// when the test process itself dies: a crashed test leaves no vipproxy behind.
var spawner = func() chan func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread()
		for f := range ch {
			f()
		}
	}()
	return ch
}()

// StartProcess starts cmd from the spawner thread with Pdeathsig SIGKILL,
// so the child dies with the test (or benchmark) process and never
// earlier. Every harness that runs commands in namespaces uses it (through
// Process).
func StartProcess(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	errc := make(chan error, 1)
	spawner <- func() { errc <- cmd.Start() }
	return <-errc
}

// DefaultKillWait is how long Kill waits for a process to be reaped when
// Process.KillWait is zero: on a loaded machine a many-threaded process takes
// seconds to finish exiting.
const DefaultKillWait = 60 * time.Second

// Process is a command running inside a network namespace via `ip netns
// exec` (which execs, so the PID is the command's own), started with
// StartProcess. Its stdout and stderr are appended to LogPath across
// restarts, between marker lines "=== <LogTag>: <time> start: <argv>" and
// "=== <LogTag>: <time> exit: <status>". Signals go to its PID only. Start
// may be called again after the process exited, with the same (or changed)
// Argv. The exported fields must not change while it runs; the methods are
// safe for concurrent use.
type Process struct {
	Name    string   // for messages: "etcd", "vipproxy on node1"
	NS      string   // network namespace name (under /run/netns)
	Argv    []string // binary and arguments
	LogPath string
	// LogTag names the harness in the log's marker lines ("" means "e2e").
	LogTag string
	// KillWait bounds how long Kill (and Stop after its grace) waits for the
	// exit after SIGKILL (0 means DefaultKillWait).
	KillWait time.Duration

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the last run has been reaped
	err     error         // exit status of the last run
	started time.Time
}

// Start starts the process and records the start time. It fails if the
// process is already running, or if the log cannot be opened or the command
// cannot be started.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("%s: already running (pid %d)", p.Name, p.cmd.Process.Pid)
		}
	}
	tag := p.LogTag
	if tag == "" {
		tag = "e2e"
	}
	f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: log: %w", p.Name, err)
	}
	fmt.Fprintf(f, "=== %s: %s start: %s\n", tag, time.Now().Format(time.RFC3339Nano), strings.Join(p.Argv, " "))
	cmd := exec.Command("ip", append([]string{"netns", "exec", p.NS}, p.Argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	started := time.Now()
	if err := StartProcess(cmd); err != nil {
		f.Close()
		return fmt.Errorf("%s: start: %w", p.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.started = cmd, done, started
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(f, "=== %s: %s exit: %v\n", tag, time.Now().Format(time.RFC3339Nano), err)
		f.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Started returns when Start last launched the process (zero before).
func (p *Process) Started() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started
}

// PID returns the process ID of the last run (0 before Start).
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the process has been started and not exited.
func (p *Process) Running() bool {
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

// ExitErr returns the exit status of the last run (nil while running or
// after a clean exit).
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Signal sends sig to the process's PID, unless it is not running, and
// reports whether it has exited (and been reaped) within wait.
func (p *Process) Signal(sig syscall.Signal, wait time.Duration) bool {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return true
	}
	select {
	case <-done:
		return true
	default:
	}
	cmd.Process.Signal(sig)
	select {
	case <-done:
		return true
	case <-time.After(wait):
		return false
	}
}

// Kill sends SIGKILL and waits up to KillWait for the exit. It reports
// whether the process was reaped.
func (p *Process) Kill() bool {
	wait := p.KillWait
	if wait == 0 {
		wait = DefaultKillWait
	}
	return p.Signal(syscall.SIGKILL, wait)
}

// Stop sends SIGTERM and waits up to grace for the exit, then kills the
// process (Kill). It reports whether the process exited within grace.
func (p *Process) Stop(grace time.Duration) bool {
	if p.Signal(syscall.SIGTERM, grace) {
		return true
	}
	p.Kill()
	return false
}

// Log returns everything the process has written so far ("" if the log
// cannot be read).
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// Tail returns the last n lines of the log.
func (p *Process) Tail(n int) string { return tail(p.Log(), n) }
