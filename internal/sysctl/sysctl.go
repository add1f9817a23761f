// Package sysctl sets kernel parameters and remembers the values it
// replaced, so that `vipproxy --cleanup` can put them back.
package sysctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// FS reads and writes kernel parameters by absolute path
// (/proc/sys/net/..., /sys/module/...).
type FS interface {
	Read(path string) (string, error)
	Write(path, value string) error
}

// OSFS is the real FS.
type OSFS struct{}

// Read returns the parameter's value without surrounding space.
func (OSFS) Read(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// Write sets the parameter.
func (OSFS) Write(path, value string) error {
	return os.WriteFile(path, []byte(value), 0o644)
}

// Setter changes parameters and journals the originals. The zero value is
// not usable: FS is required; Journal may be empty (no restore possible).
type Setter struct {
	FS FS
	// Journal is the JSON file recording original values; "" disables it.
	Journal string

	mu sync.Mutex
}

// Set makes path hold value. It does nothing when the value is already
// there. Before the first change of a path it records the original value in
// the journal (never overwriting an earlier record, so the journal keeps the
// value from before vipproxy ever ran). Errors name the path; a missing or
// read-only parameter gives an error that errors.Is fs.ErrNotExist or
// fs.ErrPermission respectively, which callers report as warnings.
func (s *Setter) Set(path, value string) (changed bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, err := s.FS.Read(path)
	if err != nil {
		return false, fmt.Errorf("sysctl %s: %w", path, err)
	}
	if cur == value {
		return false, nil
	}
	// Journal first, so a crash after the write still knows the original;
	// take the entry back when the write fails.
	var j map[string]string
	added := false
	if s.Journal != "" {
		if j, err = readJournal(s.Journal); err != nil {
			return false, err
		}
		if _, ok := j[path]; !ok {
			j[path], added = cur, true
			if err := writeJournal(s.Journal, j); err != nil {
				return false, err
			}
		}
	}
	if err := s.FS.Write(path, value); err != nil {
		if added {
			delete(j, path)
			_ = writeJournal(s.Journal, j)
		}
		return false, fmt.Errorf("sysctl %s = %s: %w", path, value, err)
	}
	return true, nil
}

// Restore writes back every journaled original value and removes the
// journal. It returns the paths restored; a missing journal is not an
// error. Paths that fail to restore stay in the journal.
func Restore(fsys FS, journal string) ([]string, error) {
	j, err := readJournal(journal)
	if err != nil {
		return nil, err
	}
	var restored []string
	var errs []error
	paths := make([]string, 0, len(j))
	for p := range j {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if err := fsys.Write(p, j[p]); err != nil {
			errs = append(errs, fmt.Errorf("sysctl restore %s = %s: %w", p, j[p], err))
			continue
		}
		restored = append(restored, p)
		delete(j, p)
	}
	if len(j) == 0 {
		if err := os.Remove(journal); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	} else if err := writeJournal(journal, j); err != nil {
		errs = append(errs, err)
	}
	return restored, errors.Join(errs...)
}

func readJournal(path string) (map[string]string, error) {
	j := map[string]string{}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return j, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sysctl journal: %w", err)
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("sysctl journal %s: %w", path, err)
	}
	return j, nil
}

func writeJournal(path string, j map[string]string) error {
	b, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("sysctl journal: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("sysctl journal: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("sysctl journal: %w", err)
	}
	return nil
}

// Journaled is an FS whose writes go through a Setter: the original of a
// changed value is journaled first, and writing the value already there
// does nothing. The IPVS mode writes its sysctls through one, so that
// --cleanup (another process, maybe after a crash) puts them back.
type Journaled struct{ *Setter }

// Read implements FS.
func (j Journaled) Read(path string) (string, error) { return j.FS.Read(path) }

// Write implements FS.
func (j Journaled) Write(path, value string) error {
	_, err := j.Set(path, value)
	return err
}

// Fake is an in-memory FS for tests. Missing paths fail with
// fs.ErrNotExist; paths in ReadOnly fail writes with fs.ErrPermission.
type Fake struct {
	mu       sync.Mutex
	Values   map[string]string
	ReadOnly map[string]bool
	Writes   []string
}

// Read implements FS.
func (f *Fake) Read(path string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.Values[path]
	if !ok {
		return "", fs.ErrNotExist
	}
	return v, nil
}

// Write implements FS.
func (f *Fake) Write(path, value string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.Values[path]; !ok {
		return fs.ErrNotExist
	}
	if f.ReadOnly[path] {
		return fs.ErrPermission
	}
	f.Values[path] = value
	f.Writes = append(f.Writes, path+"="+value)
	return nil
}
