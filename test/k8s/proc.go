//go:build linux

package k8s

import (
	"time"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// Process is a command running inside a network namespace (e2e.Process:
// `ip netns exec`, stdout and stderr appended to LogPath across restarts,
// signals by PID only). Start may be called again after the process exited,
// with the same arguments.
type Process = e2e.Process

// killWait bounds the wait for a process's exit after SIGKILL.
const killWait = 10 * time.Second

// newProcess returns an unstarted Process named name (for messages: "etcd",
// "vipproxy node1") that runs argv (binary and arguments) in namespace ns,
// logging to logPath with "k8s" marker lines; Kill, and Stop after its
// grace, wait up to 10 s for the exit.
func newProcess(name, ns, logPath string, argv ...string) *Process {
	return &Process{Name: name, NS: ns, Argv: argv, LogPath: logPath, LogTag: "k8s", KillWait: killWait}
}
