package conntrack

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"time"

	"github.com/vipproxy/vipproxy/internal/sysctl"
)

// Settings are the conntrack parameters kube-proxy tunes. Zero values
// leave a parameter as it is.
type Settings struct {
	// Max is nf_conntrack_max: max(maxPerCore × CPUs, min), computed by
	// the caller; 0 leaves the limit alone. The hash size is raised to
	// Max/4 when smaller, as kube-proxy does.
	Max                   int
	TCPEstablishedTimeout time.Duration
	TCPCloseWaitTimeout   time.Duration
	TCPBeLiberal          bool
	UDPTimeout            time.Duration
	UDPStreamTimeout      time.Duration
}

// MaxFor computes kube-proxy's conntrack limit: maxPerCore × cpus, at
// least min; 0 when maxPerCore is 0 (leave as is).
func MaxFor(maxPerCore, min, cpus int) int {
	if maxPerCore <= 0 {
		return 0
	}
	return max(maxPerCore*cpus, min)
}

const (
	procNF   = "/proc/sys/net/netfilter/"
	hashSize = "/sys/module/nf_conntrack/parameters/hashsize"
)

// Apply sets s through set. It never stops at a failing parameter: a
// missing or read-only one (a container without a writable /sys, or a
// per-namespace limit the kernel keeps global) is returned as a warning
// among the joined errors, each naming the parameter, so the caller logs
// them and carries on.
func Apply(set *sysctl.Setter, s Settings) error {
	var errs []error
	put := func(path string, v int) bool {
		if _, err := set.Set(path, strconv.Itoa(v)); err != nil {
			errs = append(errs, err)
			return false
		}
		return true
	}
	// The hash size is global to the host: touch it only when the limit
	// itself could be set (it is read-only outside the host's namespace).
	if s.Max > 0 && put(procNF+"nf_conntrack_max", s.Max) {
		if cur, err := set.FS.Read(hashSize); err == nil {
			if n, err := strconv.Atoi(cur); err == nil && n < s.Max/4 {
				put(hashSize, s.Max/4)
			}
		}
	}
	secs := func(name string, d time.Duration) {
		if d > 0 {
			put(procNF+name, int(d/time.Second))
		}
	}
	secs("nf_conntrack_tcp_timeout_established", s.TCPEstablishedTimeout)
	secs("nf_conntrack_tcp_timeout_close_wait", s.TCPCloseWaitTimeout)
	if s.TCPBeLiberal {
		put(procNF+"nf_conntrack_tcp_be_liberal", 1)
	}
	secs("nf_conntrack_udp_timeout", s.UDPTimeout)
	secs("nf_conntrack_udp_timeout_stream", s.UDPStreamTimeout)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("conntrack settings: %w", err)
	}
	return nil
}

// IsWarning reports whether an Apply error only concerns parameters that
// are missing or read-only.
func IsWarning(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)
}
