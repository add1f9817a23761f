package ipvs

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
)

// Sysctl reads and writes sysctls by their /proc/sys relative path
// ("net/ipv4/vs/conntrack"). Implementations: ProcSysctl and FakeSysctl.
type Sysctl interface {
	Read(name string) (string, error)
	Write(name, value string) error
}

// ProcSysctl reads and writes /proc/sys of the current network namespace.
type ProcSysctl struct{}

// Read implements Sysctl.
func (ProcSysctl) Read(name string) (string, error) {
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		return "", fmt.Errorf("ipvs: read sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Write implements Sysctl.
func (ProcSysctl) Write(name, value string) error {
	if err := os.WriteFile("/proc/sys/"+name, []byte(value+"\n"), 0o644); err != nil {
		return fmt.Errorf("ipvs: write sysctl %s=%s: %w", name, value, err)
	}
	return nil
}

// FakeSysctl is an in-memory Sysctl; reading an unset name fails like a
// missing /proc/sys file. The zero value is usable.
type FakeSysctl struct {
	mu     sync.Mutex
	Values map[string]string
	writes []string
}

// Read implements Sysctl.
func (f *FakeSysctl) Read(name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.Values[name]
	if !ok {
		return "", fmt.Errorf("ipvs: read sysctl %s: %w", name, os.ErrNotExist)
	}
	return v, nil
}

// Write implements Sysctl.
func (f *FakeSysctl) Write(name, value string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Values == nil {
		f.Values = map[string]string{}
	}
	f.Values[name] = value
	f.writes = append(f.writes, name+"="+value)
	return nil
}

// Writes returns the writes since the last call, in order, and forgets them.
func (f *FakeSysctl) Writes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.writes
	f.writes = nil
	return slices.Clone(w)
}

// sysctlSetting is one sysctl the mode needs.
type sysctlSetting struct{ name, value string }

// sysctls returns what kube-proxy sets in IPVS mode: IPVS connection
// tracking (so iptables masquerade sees IPVS connections), expiring
// connections to removed real servers and quiescent persistence templates,
// forwarding, and with strictARP arp_ignore=1 / arp_announce=2.
func sysctls(strictARP bool) []sysctlSetting {
	s := []sysctlSetting{
		{"net/ipv4/vs/conntrack", "1"},
		{"net/ipv4/vs/expire_nodest_conn", "1"},
		{"net/ipv4/vs/expire_quiescent_template", "1"},
		{"net/ipv4/ip_forward", "1"},
	}
	if strictARP {
		s = append(s, sysctlSetting{"net/ipv4/conf/all/arp_ignore", "1"}, sysctlSetting{"net/ipv4/conf/all/arp_announce", "2"})
	}
	return s
}
