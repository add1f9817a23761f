//go:build linux

package k8s

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// Process is a command running inside a network namespace (via `ip netns
// exec`), with stdout and stderr appended to LogPath across restarts.
// Start may be called again after the process exited, with the same
// arguments.
type Process struct {
	Name    string // for messages: "etcd", "kube-apiserver", "vipproxy node1"
	NS      string
	Argv    []string // binary and arguments
	LogPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts the process. It fails if it is already running or cannot be
// started.
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
	f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: log: %w", p.Name, err)
	}
	fmt.Fprintf(f, "=== k8s: %s start: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(p.Argv, " "))
	cmd := exec.Command("ip", append([]string{"netns", "exec", p.NS}, p.Argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := e2e.StartProcess(cmd); err != nil {
		f.Close()
		return fmt.Errorf("%s: start: %w", p.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(f, "=== k8s: %s exit: %v\n", time.Now().Format(time.RFC3339Nano), err)
		f.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Running reports whether the process was started and has not exited.
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

// Stop sends SIGTERM (by PID) and waits up to grace for the exit, then
// sends SIGKILL and waits up to 10 s more. It reports whether the process
// exited within grace.
func (p *Process) Stop(grace time.Duration) bool {
	if p.signal(syscall.SIGTERM, grace) {
		return true
	}
	p.signal(syscall.SIGKILL, 10*time.Second)
	return false
}

// Kill sends SIGKILL and waits up to 10 s for the exit.
func (p *Process) Kill() { p.signal(syscall.SIGKILL, 10*time.Second) }

func (p *Process) signal(sig syscall.Signal, wait time.Duration) bool {
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
	// ip netns exec execs the binary, so the PID is the binary's own.
	cmd.Process.Signal(sig)
	select {
	case <-done:
		return true
	case <-time.After(wait):
		return false
	}
}

// Log returns what the process has written so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// Tail returns the last n lines of the log.
func (p *Process) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
