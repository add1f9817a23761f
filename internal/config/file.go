package config

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// DecodeError is returned by LoadFile and DecodeFile when the file's
// content is not a valid KubeProxyConfiguration document. Problems holds
// one entry per finding, e.g. `unknown field "conntrack.maxPerCorez"`.
type DecodeError struct {
	File     string
	Problems []string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("config file %s: %s", e.File, strings.Join(e.Problems, "; "))
}

// LoadFile reads and strictly decodes a KubeProxyConfiguration file, YAML
// or JSON. apiVersion must be kubeproxy.config.k8s.io/v1alpha1 and kind
// KubeProxyConfiguration; unknown and duplicate fields are errors that
// name the field with its full path (`unknown field
// "conntrack.maxPerCorez"`), field names are case-sensitive. LoadLenient
// is what vipproxy runs with: kube-proxy's fallback.
//
// The result is NOT defaulted (see SetDefaults) and not validated. A read
// failure is returned wrapped with the path; a content failure is a
// *DecodeError.
func LoadFile(path string) (*kpv1alpha1.KubeProxyConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	return DecodeFile(filepath.Base(path), data)
}

// LoadLenient is LoadFile with kube-proxy's fallback: when the strict
// decode finds only unknown or duplicate fields, the file is decoded
// leniently (unknown fields ignored, the last of duplicates kept) and the
// findings come back as warnings naming each field. Everything else that
// LoadFile refuses (wrong apiVersion or kind, a value of the wrong type,
// not YAML) is still an error.
func LoadLenient(path string) (*kpv1alpha1.KubeProxyConfiguration, []string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("config file: %w", err)
	}
	return decode(filepath.Base(path), data, true)
}

// DecodeFile is LoadFile on bytes already read; name is used in errors.
func DecodeFile(name string, data []byte) (*kpv1alpha1.KubeProxyConfiguration, error) {
	kp, _, err := decode(name, data, false)
	return kp, err
}

// decode is DecodeFile; lenient turns unknown and duplicate fields into
// warnings (see LoadLenient).
func decode(name string, data []byte, lenient bool) (*kpv1alpha1.KubeProxyConfiguration, []string, error) {
	fail := func(format string, args ...any) error {
		return &DecodeError{File: name, Problems: []string{fmt.Sprintf(format, args...)}}
	}
	if strings.TrimSpace(string(data)) == "" {
		return nil, nil, fail("file is empty")
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, nil, fail("not valid YAML or JSON: %v", err)
	}
	var meta struct {
		APIVersion *string `json:"apiVersion"`
		Kind       *string `json:"kind"`
	}
	if err := json.Unmarshal(js, &meta); err != nil {
		return nil, nil, fail("not a YAML or JSON object: %v", err)
	}
	var probs []string
	switch {
	case meta.APIVersion == nil:
		probs = append(probs, fmt.Sprintf("apiVersion is missing, want %q", APIVersion))
	case *meta.APIVersion != APIVersion:
		probs = append(probs, fmt.Sprintf("apiVersion %q is not supported, want %q", *meta.APIVersion, APIVersion))
	}
	switch {
	case meta.Kind == nil:
		probs = append(probs, fmt.Sprintf("kind is missing, want %q", Kind))
	case *meta.Kind != Kind:
		probs = append(probs, fmt.Sprintf("kind %q is not supported, want %q", *meta.Kind, Kind))
	}
	if len(probs) > 0 {
		return nil, nil, &DecodeError{File: name, Problems: probs}
	}
	kp := &kpv1alpha1.KubeProxyConfiguration{}
	strict, err := sigsjson.UnmarshalStrict(js, kp)
	if err != nil {
		return nil, nil, fail("%s", strings.TrimPrefix(err.Error(), "json: "))
	}
	for _, e := range strict {
		probs = append(probs, e.Error())
	}
	switch {
	case len(probs) == 0:
		return kp, nil, nil
	case lenient:
		// sigsjson filled kp as a lenient decode would (the strict errors
		// are unknown and duplicate fields only): kube-proxy's fallback.
		warns := make([]string, len(probs))
		for i, p := range probs {
			warns[i] = fmt.Sprintf("config file %s: %s; ignored, as kube-proxy does", name, p)
		}
		return kp, warns, nil
	}
	return nil, nil, &DecodeError{File: name, Problems: probs}
}

// WriteConfig writes c.KubeProxy as a KubeProxyConfiguration YAML document
// that LoadFile reads back to an equal configuration. Only I/O errors are
// returned.
func WriteConfig(w io.Writer, c *Config) error {
	kp := c.KubeProxy.DeepCopy()
	kp.APIVersion, kp.Kind = APIVersion, Kind
	out, err := yaml.Marshal(kp)
	if err != nil {
		return fmt.Errorf("config: encode: %w", err)
	}
	if _, err := w.Write(out); err != nil {
		return fmt.Errorf("config: write: %w", err)
	}
	return nil
}

// WriteConfigFile implements --write-config-to: it writes c (see
// WriteConfig) to path, replacing a regular file atomically (temporary
// file and rename in the same directory, mode 0644) so a running vipproxy
// watching it never reads half a file; a symlink or a non-regular path
// (/dev/stdout, even when it leads to a regular file) is written through,
// never replaced. The caller exits afterwards. Like
// kube-proxy, it writes the configuration the command line produced; call
// Validate first to refuse writing an invalid one.
func WriteConfigFile(path string, c *Config) (err error) {
	lfi, lerr := os.Lstat(path)
	fi, statErr := os.Stat(path)
	if (lerr == nil && lfi.Mode()&os.ModeSymlink != 0) || (statErr == nil && !fi.Mode().IsRegular()) {
		// A symlink (/dev/stdout → /proc/self/fd/1 → a file, say) or a
		// device is written through, never replaced.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("config: --write-config-to: %w", err)
		}
		defer func() {
			if cerr := f.Close(); err == nil && cerr != nil {
				err = fmt.Errorf("config: --write-config-to: %w", cerr)
			}
		}()
		return WriteConfig(f, c)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("config: --write-config-to: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if err := WriteConfig(tmp, c); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("config: --write-config-to: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("config: --write-config-to: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("config: --write-config-to: %w", err)
	}
	return nil
}

// Reload builds the Config a live reload switches to: running's
// flag-level settings (vipproxy's own flags, --master, and the flags that
// win over the file: -v, --logging-format, --hostname-override) combined
// with the file at path, defaulted and validated against the real host.
// On any error (read, decode, validation: a *DecodeError or an ErrorList)
// it returns nil and the running Config stays in force; running is never
// modified.
func Reload(path string, running *Config) (*Config, error) {
	return ReloadWithHost(path, running, OSHost{})
}

// ReloadWithHost is Reload validating against h.
func ReloadWithHost(path string, running *Config, h Host) (*Config, error) {
	kp, warns, err := LoadLenient(path)
	if err != nil {
		return nil, err
	}
	next := &Config{
		KubeProxy:             *kp,
		ModeDefaulted:         kp.Mode == "",
		ConfigFile:            path,
		WriteConfigTo:         running.WriteConfigTo,
		Cleanup:               running.Cleanup,
		CleanupKubeProxy:      running.CleanupKubeProxy,
		Master:                running.Master,
		Manifests:             running.Manifests,
		StateDir:              running.StateDir,
		Registry:              running.Registry,
		ServiceClusterIPRange: running.ServiceClusterIPRange,
		ServiceNodePortRange:  running.ServiceNodePortRange,
		ExternalIPCIDRs:       running.ExternalIPCIDRs,
		IgnoredFlags:          append([]string(nil), running.IgnoredFlags...),
		overrides:             running.overrides,
		parseWarns:            append(slices.Clone(running.parseWarns), warns...),
	}
	next.complete()
	if err := next.Validate(h); err != nil {
		return nil, err
	}
	return next, nil
}

// complete applies defaults and the command-line overrides and derives
// the mirrored fields.
func (c *Config) complete() {
	SetDefaults(&c.KubeProxy)
	c.completeFlags()
}

// completeFlags is complete for a KubeProxy that was defaulted before the
// flags were applied, as kube-proxy does: SetDefaults again would turn an
// explicit --iptables-min-sync-period=0 back into 1s. Only the health and
// metrics addresses, which follow --bind-address, are filled in.
func (c *Config) completeFlags() {
	defaultAddresses(&c.KubeProxy)
	c.setOwnDefaults()
	c.applyOverrides()
	c.ProfilingEnabled = c.KubeProxy.EnableProfiling
}
