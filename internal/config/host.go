package config

import (
	"bufio"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Host answers the questions Validate asks about the machine. OSHost is
// the real one; FakeHost serves tests.
type Host interface {
	// LookPath finds an executable in PATH (exec.LookPath).
	LookPath(file string) (string, error)
	// KernelFeature reports whether the running kernel has a feature
	// ("nf_tables", "ip_tables", "ip_vs", "nf_conntrack"), built in,
	// loaded or loadable. known is false when the host cannot tell.
	KernelFeature(name string) (present, known bool)
	// Hostname returns the kernel's host name (os.Hostname).
	Hostname() (string, error)
	// Getenv returns an environment variable (os.Getenv).
	Getenv(key string) string
	// Stat describes a file (os.Stat).
	Stat(name string) (fs.FileInfo, error)
}

// OSHost is the Host of the running machine. Its zero value is ready.
type OSHost struct{}

var _ Host = OSHost{}

// LookPath implements Host.
func (OSHost) LookPath(file string) (string, error) { return exec.LookPath(file) }

// Hostname implements Host.
func (OSHost) Hostname() (string, error) { return os.Hostname() }

// Getenv implements Host.
func (OSHost) Getenv(key string) string { return os.Getenv(key) }

// Stat implements Host.
func (OSHost) Stat(name string) (fs.FileInfo, error) { return os.Stat(name) }

// kernelFeatures maps a feature to its module name and kernel config
// symbol.
var kernelFeatures = map[string]struct{ module, symbol, proc string }{
	"nf_tables":    {"nf_tables", "CONFIG_NF_TABLES", ""},
	"ip_tables":    {"ip_tables", "CONFIG_IP_NF_IPTABLES", "/proc/net/ip_tables_names"},
	"ip_vs":        {"ip_vs", "CONFIG_IP_VS", "/proc/net/ip_vs"},
	"nf_conntrack": {"nf_conntrack", "CONFIG_NF_CONNTRACK", "/proc/sys/net/netfilter/nf_conntrack_max"},
}

// KernelFeature implements Host. It looks, in order, at a /proc file the
// feature creates, /sys/module/<module>, the kernel build configuration
// (/proc/config.gz or /boot/config-<release>: =y or =m is present, "is not
// set" is absent) and the module tree /lib/modules/<release>
// (modules.builtin, modules.dep). When the kernel has no module support
// (no module tree and the feature not loaded) an unloaded feature is
// known absent. Otherwise it reports unknown.
func (OSHost) KernelFeature(name string) (present, known bool) {
	kf, ok := kernelFeatures[name]
	if !ok {
		return false, false
	}
	if kf.proc != "" {
		if _, err := os.Stat(kf.proc); err == nil {
			return true, true
		}
	}
	if _, err := os.Stat("/sys/module/" + kf.module); err == nil {
		return true, true
	}
	release := kernelRelease()
	if v, ok := kernelConfig(release, kf.symbol); ok {
		return v, true
	}
	if release != "" {
		dir := "/lib/modules/" + release + "/"
		found, readable := false, false
		for _, f := range []string{"modules.builtin", "modules.dep"} {
			data, err := os.ReadFile(dir + f)
			if err != nil {
				continue
			}
			readable = true
			if strings.Contains(string(data), "/"+kf.module+".ko") {
				found = true
			}
		}
		if readable {
			return found, true
		}
		if _, err := os.Stat("/proc/modules"); errors.Is(err, fs.ErrNotExist) {
			return false, true // no module support: what is not there never will be
		}
	}
	return false, false
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// kernelConfig looks symbol up in the kernel's build configuration.
func kernelConfig(release, symbol string) (value, ok bool) {
	var r io.Reader
	if f, err := os.Open("/proc/config.gz"); err == nil {
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return false, false
		}
		r = zr
	} else if release != "" {
		f, err := os.Open("/boot/config-" + release)
		if err != nil {
			return false, false
		}
		defer f.Close()
		r = f
	} else {
		return false, false
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		switch line {
		case symbol + "=y", symbol + "=m":
			return true, true
		case "# " + symbol + " is not set":
			return false, true
		}
	}
	return false, false
}

// FakeHost is a Host for tests: binaries in Paths are found, features in
// Kernel are present (true) or absent (false) and missing ones unknown,
// files in Files exist (true = directory).
type FakeHost struct {
	Paths    map[string]string
	Kernel   map[string]bool
	Name     string
	NameErr  error
	Env      map[string]string
	Files    map[string]bool
	StatErrs map[string]error
}

var _ Host = (*FakeHost)(nil)

// LookPath implements Host.
func (h *FakeHost) LookPath(file string) (string, error) {
	if p, ok := h.Paths[file]; ok {
		return p, nil
	}
	return "", &exec.Error{Name: file, Err: exec.ErrNotFound}
}

// KernelFeature implements Host.
func (h *FakeHost) KernelFeature(name string) (present, known bool) {
	v, ok := h.Kernel[name]
	return v, ok
}

// Hostname implements Host.
func (h *FakeHost) Hostname() (string, error) { return h.Name, h.NameErr }

// Getenv implements Host.
func (h *FakeHost) Getenv(key string) string { return h.Env[key] }

// Stat implements Host.
func (h *FakeHost) Stat(name string) (fs.FileInfo, error) {
	if err, ok := h.StatErrs[name]; ok {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	dir, ok := h.Files[name]
	if !ok {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
	}
	return fakeInfo{name: name, dir: dir}, nil
}

type fakeInfo struct {
	name string
	dir  bool
}

func (f fakeInfo) Name() string { return f.name }
func (f fakeInfo) Size() int64  { return 0 }
func (f fakeInfo) Mode() fs.FileMode {
	if f.dir {
		return fs.ModeDir | 0o755
	}
	return 0o644
}
func (f fakeInfo) ModTime() time.Time { return time.Time{} }
func (f fakeInfo) IsDir() bool        { return f.dir }
func (f fakeInfo) Sys() any           { return nil }
