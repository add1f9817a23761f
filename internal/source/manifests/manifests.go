// Package manifests is vipproxy's standalone source: it watches a
// directory of Kubernetes-style YAML or JSON manifests (v1 Service,
// discovery.k8s.io/v1 EndpointSlice and this host's v1 Node) and emits a
// complete Snapshot after the first read and after every change.
//
// Robustness rules, in the order an operator meets them:
//   - Files named *.yaml, *.yml or *.json are read; names starting with
//     "." are skipped (editor swap and lock files). Symlinks are followed,
//     so a ConfigMap mounted as a volume works.
//   - A document that does not parse or an object that is invalid is
//     reported as a Problem naming the file, the document (counted from
//     1) and the field (Problem.File set, so that the reconcile loop, the
//     one place problems are logged, can bound the lines one file
//     gets). The last good version
//     of that object from that file stays in force; other objects keep
//     working.
//   - Deleting a file removes its objects. Deleting the directory itself
//     does not: while it is missing the last state stays in force with a
//     Problem, and the watch resumes when it reappears.
//   - An object (kind, namespace, name) defined in two places is used from
//     the first file in name order (then the first document); the other
//     copies are Problems.
//   - Services get missing ClusterIPs and NodePorts from Options.Assigner,
//     which is called only when a Service changed, and Release is called
//     when a Service disappears.
package manifests

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/source"
)

// Defaults for Options.
const (
	// DefaultDebounce is the quiet period after a directory event before
	// the directory is re-read. Every change waits for it, so it is short:
	// the target is p99 ≤ 50 ms from a manifest write to traffic through
	// the VIP at 10,000 Services, and a re-read of one changed file plus
	// the snapshot costs a few milliseconds. 10 ms still coalesces what
	// one save or one copy of many files produces (their events arrive
	// microseconds apart, even when the writer is descheduled for a few
	// milliseconds on a loaded machine); a file read half-written is
	// refused with a Problem, its last good version stays in force, and
	// the next event re-reads it. Longer streams are capped by
	// source.MaxDebounces (100 ms by default after the first event of a
	// burst).
	DefaultDebounce = 10 * time.Millisecond
	DefaultRescan   = 30 * time.Second
	// dirPoll is how often a missing directory is looked for.
	dirPoll = time.Second
)

// Options configure a Source.
type Options struct {
	// Dir is the directory to watch. It must exist when Run starts.
	Dir string
	// Assigner fills in ClusterIPs and NodePorts a manifest leaves empty.
	// nil means no allocation: a Service without a clusterIP is refused with
	// a Problem, and a missing nodePort is a Problem (the port stays
	// reachable on its ClusterIP).
	Assigner source.Assigner
	// NodeName selects the one v1 Node document that is used; Node
	// documents with other names are ignored. "" ignores every Node.
	NodeName string
	// Debounce is how long the directory must be quiet before it is
	// re-read (0 means DefaultDebounce).
	Debounce time.Duration
	// Rescan is the period of a check that catches anything the watch
	// missed: every file is hashed (beside the loop, see verify), then the
	// directory is scanned again, reading the files whose size, mtime or
	// content changed (0 means DefaultRescan).
	Rescan time.Duration
	// Logger receives problems and watch trouble (nil discards).
	Logger *slog.Logger
	// CacheFile, when set with CacheVersion, is where the decode of the
	// first read is kept for the next run (see cache.go); CacheVersion
	// names what decoding depends on besides the files (vipproxy: its
	// executable). A cache of another version is ignored.
	CacheFile, CacheVersion string
}

// Source watches a manifest directory. Create it with New; a Source runs
// once.
type Source struct {
	opts Options
	log  *slog.Logger

	// What was read (manifests.go): each file's objects, and whether a
	// file must be looked at again.
	files   map[string]*fileState // by base name
	recheck bool                  // a re-read kept a file found empty moments after a write (see apply)
	dir     dirWatch              // the directory's watch and readability (watch.go)

	// What was sent (snapshot.go, incremental.go).
	last    *model.Snapshot
	gen     uint64      // counts full merges (assignment bookkeeping)
	snaps   uint64      // numbers snapshots (model.Snapshot.Gen)
	inc     incState    // lets a change that only edits objects in place skip the merge
	assigns assignments // the Assigner's results by Service

	// The decode cache (cache.go): loaded for the first read, and that
	// read's files, for writing the cache.
	cache      *cacheFile
	firstRead  []cachedFile
	cacheHits  int
	cacheStale bool // the loaded cache holds records this read did not use
	// cachePending is the first read's decode until it is written.
	cachePending []cachedFile
	lastSent     time.Time // when the last snapshot was sent

	// Test knobs.
	noIncremental bool // forces full merges (tests compare the two)
	workers       int  // bounds parallel file decoding (0: GOMAXPROCS; tests set 1)
}

// New returns a Source for opts with defaults applied.
func New(opts Options) *Source {
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	if opts.Rescan <= 0 {
		opts.Rescan = DefaultRescan
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("source", "manifests", "dir", opts.Dir)
	return &Source{
		opts:    opts,
		log:     log,
		files:   map[string]*fileState{},
		dir:     dirWatch{path: opts.Dir, log: log},
		assigns: assignments{byService: map[model.ServiceName]*assignState{}},
	}
}

var _ source.Source = (*Source)(nil)

// fileState is what one file contributes.
type fileState struct {
	size    int64
	modTime time.Time
	sum     [sha256.Size]byte
	// good holds the objects in force from this file, in file order: the
	// usable objects of its current content, plus the last good version of
	// objects whose current document is broken.
	good     []entry
	problems []model.Problem
}

// Run watches the directory until ctx is done (then it returns nil). It
// fails only when the directory does not exist at start or the watch
// cannot be set up at all.
func (s *Source) Run(ctx context.Context, out chan<- *model.Snapshot) error {
	if _, err := os.Stat(s.opts.Dir); err != nil {
		return fmt.Errorf("manifests: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("manifests: watch: %w", err)
	}
	defer w.Close()
	s.dir.w = w
	s.dir.ensure()

	s.cache = s.loadCache()
	first := s.rescan(ctx, true)
	s.cache = nil
	if !s.send(ctx, out, first, true) {
		return nil
	}
	cacheWrite := s.scheduleCacheWrite()

	debounce := source.NewDebounce(s.opts.Debounce)
	defer debounce.Stop()
	schedule := func() { debounce.Event(time.Now()) }
	rescan := time.NewTicker(s.opts.Rescan)
	defer rescan.Stop()
	var verified chan []string // the periodic check's result, while it runs
	poll := time.NewTicker(dirPoll)
	defer poll.Stop()

	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("manifests: watcher closed")
			}
			if filepath.Clean(ev.Name) == filepath.Clean(s.opts.Dir) && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				s.dir.on = false
			}
			schedule()
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("manifests: watcher closed")
			}
			s.log.Warn("watch error; re-reading the directory", "err", err)
			schedule()
		case <-debounce.C:
			debounce.Fired()
			if !s.send(ctx, out, s.rescan(ctx, false), false) {
				return nil
			}
			if s.recheck {
				schedule() // a file looked caught mid-rewrite: look again
			}
		case <-rescan.C:
			if verified == nil {
				ch := make(chan []string, 1)
				verified = ch
				sums := s.sums()
				go func() { ch <- verify(s.opts.Dir, sums) }()
			}
		case stale := <-verified:
			verified = nil
			s.markStale(stale)
			if !s.send(ctx, out, s.rescan(ctx, false), false) {
				return nil
			}
		case <-cacheWrite:
			if wait := cacheWait(time.Now(), s.lastSent); wait > 0 {
				cacheWrite = time.After(wait) // a change is being programmed
				continue
			}
			cacheWrite = nil
			s.writeCacheNow()
		case <-poll.C:
			if !s.dir.on && s.dir.ensure() {
				schedule()
			}
		}
	}
}

// send emits snap unless it equals the previous one (always when first).
// It reports false when ctx ended first.
func (s *Source) send(ctx context.Context, out chan<- *model.Snapshot, snap *model.Snapshot, first bool) bool {
	if !first && snapshotsEqual(snap, s.last) {
		return true
	}
	select {
	case out <- snap:
		s.last, s.lastSent = snap, time.Now()
		return true
	case <-ctx.Done():
		return false
	}
}

// manifestName reports whether a directory entry is a manifest file.
func manifestName(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// rescan re-reads the directory and returns the resulting snapshot. With
// force, files are re-read even when their size and mtime are unchanged
// (their content hash still avoids re-decoding).
func (s *Source) rescan(ctx context.Context, force bool) *model.Snapshot {
	s.recheck = false
	var dirProblems []model.Problem
	ents, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		if !s.dir.unreadable {
			s.log.Warn("cannot read manifest directory; keeping the last state", "err", err)
		}
		s.dir.unreadable = true
		dirProblems = append(dirProblems, model.Problem{Object: "directory " + s.opts.Dir,
			Reason: "cannot read: " + errReason(err) + "; the last state stays in force"})
	} else {
		if s.dir.unreadable {
			s.log.Info("manifest directory readable again")
		}
		s.dir.unreadable = false
		s.dir.ensure()
		seen := make(map[string]bool, len(ents))
		var jobs []readJob
		for _, de := range ents {
			name := de.Name()
			if !manifestName(name) {
				continue
			}
			fi, err := os.Stat(filepath.Join(s.opts.Dir, name)) // follows symlinks
			if err != nil || !fi.Mode().IsRegular() {
				continue // vanished meanwhile, dangling symlink or a directory
			}
			seen[name] = true
			prev := s.files[name]
			if prev != nil && !force && prev.size == fi.Size() && prev.modTime.Equal(fi.ModTime()) {
				continue
			}
			jobs = append(jobs, readJob{name: name, fi: fi, prev: prev})
		}
		s.readAll(jobs)
		s.noteFirstRead(jobs)
		for i := range jobs {
			if !s.apply(&jobs[i]) {
				s.inc.structural = true
			}
		}
		for name := range s.files {
			if !seen[name] {
				s.log.Info("manifest file removed", "file", name)
				delete(s.files, name)
				s.inc.structural = true
			}
		}
	}
	if len(dirProblems) > 0 {
		s.inc.structural = true
	}
	if snap, ok := s.incremental(ctx); ok {
		return snap
	}
	return s.snapshot(ctx, dirProblems)
}

// readJob is one file to (re)read: its input, then what reading it found.
type readJob struct {
	name string
	fi   fs.FileInfo
	prev *fileState // s.files[name] before this read, or nil

	err      error // reading failed
	sum      [sha256.Size]byte
	decoded  []entry // what decoding the content gave (or the cache had)
	cached   bool    // decoded comes from the cache
	same     bool    // content hash equals prev's: nothing to decode
	empty    bool    // the file has no bytes
	good     []entry // the file's objects in force, when not same
	problems []model.Problem
}

// readAll reads, hashes and decodes the jobs' files, in parallel on up to
// s.workers (0: GOMAXPROCS) goroutines. It only fills in the jobs (s is not written), so
// the result is the same as a serial read; apply then takes the results
// in name order.
func (s *Source) readAll(jobs []readJob) {
	workers := s.workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = min(workers, len(jobs))
	if workers <= 1 {
		for i := range jobs {
			s.read(&jobs[i])
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(jobs) {
					return
				}
				s.read(&jobs[i])
			}
		})
	}
	wg.Wait()
}

// read fills in one job. The file's bytes are dropped once decoded. A
// file read before whose size and mtime are unchanged (a forced rescan)
// is first hashed through a reused buffer and read whole only when its
// content changed; one whose size or mtime changed is read at once (it
// almost surely changed: hashing first would read it twice).
func (s *Source) read(j *readJob) {
	path := filepath.Join(s.opts.Dir, j.name)
	if j.prev != nil && j.prev.size == j.fi.Size() && j.prev.modTime.Equal(j.fi.ModTime()) {
		if sum, err := hashFile(path); err == nil && sum == j.prev.sum {
			j.sum, j.same = sum, true
			return
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		j.err = err
		return
	}
	j.sum, j.empty = sha256.Sum256(data), len(data) == 0
	if j.prev != nil && j.prev.sum == j.sum {
		j.same = true
		return
	}
	j.decoded, j.cached = s.cache.lookup(j.name, j.sum)
	if !j.cached {
		j.decoded = decodeFile(j.name, data, s.opts.NodeName)
	}
	j.good, j.problems = keepLastGood(j.name, j.prev, j.decoded)
	// The entries stay while the file is in force: drop the room that
	// appending left (up to half of them).
	if cap(j.good) > len(j.good) {
		j.good = slices.Clone(j.good)
	}
	for i := range j.problems {
		j.problems[i].File = j.name
	}
}

// fileSum is a file's name and the hash of the content last read.
type fileSum struct {
	name string
	sum  [sha256.Size]byte
}

// sums returns the hash of every file read, for verify.
func (s *Source) sums() []fileSum {
	out := make([]fileSum, 0, len(s.files))
	for name, f := range s.files {
		out = append(out, fileSum{name, f.sum})
	}
	return out
}

// verify is the periodic check for what the watch missed, run beside the
// source's loop: it hashes every file of sums in dir, one at a time, and
// returns those whose content is no longer what was read (or cannot be
// read). It reads nothing else of the Source. At 50,000 Services it hashes
// 68 MB: when the loop did that itself, a change arriving meanwhile waited
// for it (the slowest changes of a run, 30 s in).
func verify(dir string, sums []fileSum) []string {
	var stale []string
	for _, f := range sums {
		if sum, err := hashFile(filepath.Join(dir, f.name)); err != nil || sum != f.sum {
			stale = append(stale, f.name)
		}
	}
	return stale
}

// markStale makes the next rescan read the named files again (a change
// under the same size and mtime, seen by verify).
func (s *Source) markStale(names []string) {
	for _, name := range names {
		if f := s.files[name]; f != nil {
			f.size = -1
		}
	}
}

// hashBufs holds the buffers hashFile reads through.
var hashBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// hashFile returns the SHA-256 of the content of the file at path.
func hashFile(path string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	f, err := os.Open(path)
	if err != nil {
		return sum, err
	}
	defer f.Close()
	bp := hashBufs.Get().(*[]byte)
	defer hashBufs.Put(bp)
	h := sha256.New()
	if _, err := io.CopyBuffer(h, onlyReader{f}, *bp); err != nil {
		return sum, err
	}
	h.Sum(sum[:0])
	return sum, nil
}

// onlyReader hides a reader's other methods (an *os.File's WriteTo), so
// that io.CopyBuffer uses the buffer it is given.
type onlyReader struct{ io.Reader }

// apply brings s.files[j.name] up to date with what read found. It
// reports false when the change is more than new versions of the same
// objects at the same places (see incremental).
func (s *Source) apply(j *readJob) bool {
	name, fi, prev := j.name, j.fi, j.prev
	if err := j.err; err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false // removed between ReadDir and here: the next scan drops it
		}
		p := model.Problem{Object: "file " + name, Reason: "cannot read: " + errReason(err), File: name}
		if prev == nil {
			prev = &fileState{}
			s.files[name] = prev
		}
		prev.problems = []model.Problem{p}
		prev.size, prev.modTime, prev.sum = -1, time.Time{}, [sha256.Size]byte{}
		return false // prev.good stays in force
	}
	if j.same {
		prev.size, prev.modTime = fi.Size(), fi.ModTime()
		return true
	}
	if j.empty && prev != nil && len(prev.good) > 0 && time.Since(fi.ModTime()) < source.MaxDebounces*s.opts.Debounce {
		// Most likely truncated by a writer that has not written yet (an
		// in-place rewrite): keep the objects, leave size and mtime
		// unrecorded so the file is read again, and have Run look again.
		// A file really emptied is taken once it is that old.
		s.recheck = true
		return true
	}
	st := &fileState{size: fi.Size(), modTime: fi.ModTime(), sum: j.sum, good: j.good, problems: j.problems}
	s.files[name] = st
	s.log.Info("manifest file read", "file", name, "objects", len(st.good), "problems", len(st.problems))
	if prev == nil || !sameObjects(prev.good, st.good) {
		return false
	}
	s.inc.changed = append(s.inc.changed, changedFile{name, st})
	return true
}

// sameObjects reports whether a and b hold the same objects (by key) at
// the same places.
func sameObjects(a, b []entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].key != b[i].key || a[i].where != b[i].where {
			return false
		}
	}
	return true
}

// keepLastGood merges a file's freshly decoded entries with its previous
// state: usable entries win; for a broken one, the previous good version
// of the same object (found by key, or by position when the document was
// too broken to name it) stays in force.
func keepLastGood(file string, prev *fileState, entries []entry) ([]entry, []model.Problem) {
	var good []entry
	var problems []model.Problem
	allUsable := true
	for i := range entries {
		allUsable = allUsable && entries[i].usable()
		problems = append(problems, entries[i].problems...)
	}
	if allUsable {
		return entries, problems // nothing to keep from prev
	}
	problems = problems[:0]
	claimed := map[objKey]bool{}
	for _, e := range entries {
		if e.key != (objKey{}) {
			claimed[e.key] = true
		}
	}
	inGood := map[objKey]bool{}
	for _, e := range entries {
		problems = append(problems, e.problems...)
		if e.usable() {
			good = append(good, e)
			inGood[e.key] = true
			continue
		}
		if prev == nil {
			continue
		}
		var old *entry
		for i := range prev.good {
			pe := &prev.good[i]
			if (e.key != objKey{} && pe.key == e.key) || (e.key == objKey{} && pe.where == e.where && !claimed[pe.key]) {
				old = pe
				break
			}
		}
		if old == nil || inGood[old.key] {
			continue
		}
		good = append(good, *old)
		inGood[old.key] = true
		problems = append(problems, model.Problem{
			Object: "file " + file + " " + e.where.String() + " (" + old.key.String() + ")",
			Reason: "refused; the last good version stays in force",
		})
	}
	return good, problems
}

// located is an object in force and where it came from.
type located struct {
	file string
	e    *entry
}

func (l located) object() string {
	return "file " + l.file + " " + l.e.where.String() + " (" + l.e.key.String() + ")"
}
