package allocator

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/vipproxy/vipproxy/internal/model"
)

var (
	boltServices = []byte("services")
	boltMeta     = []byte("meta")
	boltRevKey   = []byte("revision")
)

// BoltStore is a Store in a bbolt file: every Update is one bbolt write
// transaction (fsynced before Update returns), so a crash leaves either
// the whole change or none of it. The file is locked: one process at a
// time.
//
// Beside the file it keeps a last good copy (LastGoodSuffix): written when
// the file opens cleanly and again a few seconds after commits, and at
// Close. It is what an operator restores when the map is damaged (see
// OpenBolt).
type BoltStore struct {
	db   *bolt.DB
	path string

	mu    sync.Mutex
	cache *Map // committed map, valid while the file is ours
	// copyTimer, when set, writes the last good copy soon; copied is the
	// revision the last good copy holds.
	copyTimer *time.Timer
	copied    int64
}

// LastGoodSuffix names the last good copy of a bbolt allocation map:
// "allocations.db" keeps "allocations.db.last-good" beside it.
const LastGoodSuffix = ".last-good"

// lastGoodDelay is how long after a commit the last good copy is
// refreshed: commits of a burst share one copy.
const lastGoodDelay = 2 * time.Second

// Reasons OpenBolt refuses an allocation map. Test with errors.Is; every
// error also carries the recovery procedure as text.
var (
	// ErrMapMissing: the map file is gone while its last good copy is
	// there, so this is not a first start: the file was deleted.
	ErrMapMissing = errors.New("allocation map is missing but its last good copy exists (deleted?)")
	// ErrMapEmpty: the map file has no bytes (truncated).
	ErrMapEmpty = errors.New("allocation map is empty (0 bytes: truncated?)")
	// ErrMapCorrupt: bbolt cannot open or read the file, or its
	// consistency check fails, or a record does not decode.
	ErrMapCorrupt = errors.New("allocation map is corrupt")
)

// OpenBolt opens the bbolt allocation map at path, creating it on a first
// start. It never hands out addresses from a map it cannot trust: a first
// start is a missing file with no last good copy beside it. It refuses,
// with an error wrapping ErrMapMissing, ErrMapEmpty or ErrMapCorrupt and
// saying what to do, a missing file whose last good copy exists, an empty
// file, and a file bbolt cannot open, that fails bbolt's consistency
// check, or that holds a record that does not decode. bbolt panics (and
// memory faults) on damaged pages are caught and returned as
// ErrMapCorrupt; OpenBolt never panics on a bad file.
//
// Recovery: move the last good copy over the map (it holds every
// allocation committed up to a few seconds before it was written, see
// BoltStore), or remove both files to start afresh, which hands out every
// ClusterIP and NodePort anew.
func OpenBolt(path string) (*BoltStore, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("allocator: state dir: %w", err)
	}
	lastGood := path + LastGoodSuffix
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, err := os.Stat(lastGood); err == nil {
			return nil, refusal(path, ErrMapMissing)
		}
	case err != nil:
		return nil, fmt.Errorf("allocator: %s: %w", path, err)
	case fi.Size() == 0:
		return nil, refusal(path, ErrMapEmpty)
	}
	s, err := openBolt(path)
	if err != nil {
		if errors.Is(err, ErrMapCorrupt) {
			return nil, refusal(path, err)
		}
		return nil, err
	}
	if err := s.writeLastGood(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// refusal wraps reason with the recovery procedure for the map at path.
func refusal(path string, reason error) error {
	lastGood := path + LastGoodSuffix
	how := ""
	if fi, err := os.Stat(lastGood); err == nil && fi.Size() > 0 {
		how = fmt.Sprintf("to restore the last good copy (written %s; allocations committed after it are lost and handed out anew), run: mv %s %s; ",
			fi.ModTime().UTC().Format(time.RFC3339), lastGood, path)
	}
	return fmt.Errorf("allocator: %s: %w; vipproxy will not start on it, since ClusterIPs and NodePorts already handed out could silently change. %sto start afresh (every ClusterIP and NodePort is handed out anew), remove %s and %s",
		path, reason, how, path, lastGood)
}

// boltMmapSize is the address space bbolt maps for the file from the
// start. bbolt maps the file anew whenever it outgrows the mapping, and
// each time copies every node the transaction touched out of the old one:
// a cold start's single transaction of 50,000 records (an 8 MiB file)
// remapped it as the file grew, and the copies were 15 % of its CPU profile
// (BenchmarkBoltAssignAllColdStart50000: 326–423 ms, 221–251 ms with it).
// Address space only: the pages the file does not fill are never touched.
const boltMmapSize = 64 << 20

// openBolt opens, checks and loads the file at path: the file must be as
// long as its meta page says, and loading reads every record, keys in
// order. A damaged file's panic or memory fault inside bbolt becomes an
// ErrMapCorrupt error. (Not tx.Check: it walks the file on a goroutine of
// its own, where a damaged page's fault cannot be recovered and ends the
// process.)
func openBolt(path string) (s *BoltStore, err error) {
	var db *bolt.DB
	// The file bbolt opens, so that a panic inside bolt.Open (which
	// leaves no DB to close) still closes it and releases its lock.
	var dbFile *os.File
	openFile := func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, perm)
		if err == nil && dbFile == nil && name == path {
			dbFile = f
		}
		return f, err
	}
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				closeQuietly(db)
			} else if dbFile != nil {
				// bolt.Open left its mapping, and so the file's lock.
				_ = unmapLeaked(dbFile)
				dbFile.Close()
			}
			s, err = nil, fmt.Errorf("%w: bbolt: %v", ErrMapCorrupt, r)
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second, OpenFile: openFile, InitialMmapSize: boltMmapSize})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("allocator: open %s: %w (another vipproxy holds it)", path, err)
		}
		return nil, fmt.Errorf("allocator: open %s: %w: %w", path, ErrMapCorrupt, err)
	}
	s = &BoltStore{db: db, path: path}
	err = db.View(func(tx *bolt.Tx) error {
		fi, err := dbFile.Stat()
		if err != nil {
			return err
		}
		if tx.Size() > fi.Size() {
			return fmt.Errorf("%w: truncated: %d bytes, the map needs %d", ErrMapCorrupt, fi.Size(), tx.Size())
		}
		return nil
	})
	if err == nil {
		err = db.Update(func(tx *bolt.Tx) error {
			sb, err := tx.CreateBucketIfNotExists(boltServices)
			if err != nil {
				return err
			}
			mb, err := tx.CreateBucketIfNotExists(boltMeta)
			if err != nil {
				return err
			}
			var rev int64
			if v := mb.Get(boltRevKey); len(v) == 8 {
				rev = int64(binary.BigEndian.Uint64(v))
			}
			base := map[model.ServiceName]Record{}
			var prev []byte
			err = sb.ForEach(func(k, v []byte) error {
				if prev != nil && bytes.Compare(prev, k) >= 0 {
					return fmt.Errorf("%w: keys out of order", ErrMapCorrupt)
				}
				prev = k
				n, err := parseServiceKey(string(k))
				if err != nil {
					return fmt.Errorf("%w: %w", ErrMapCorrupt, err)
				}
				r, err := decodeRecord(v)
				if err != nil {
					return fmt.Errorf("%w: service %s: %w", ErrMapCorrupt, n, err)
				}
				base[n] = r
				return nil
			})
			s.cache = newMap(rev, base)
			return err
		})
	}
	if err != nil {
		closeQuietly(db)
		return nil, fmt.Errorf("allocator: load %s: %w", path, err)
	}
	return s, nil
}

// closeQuietly closes a damaged database; its own panic is swallowed.
func closeQuietly(db *bolt.DB) {
	defer func() { _ = recover() }()
	_ = db.Close()
}

// writeLastGood copies the committed map to its last good copy (through
// a temporary file and a rename, so the copy is always whole).
func (s *BoltStore) writeLastGood() error {
	dst := s.path + LastGoodSuffix
	tmp := dst + ".tmp"
	var rev int64
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(boltMeta).Get(boltRevKey); len(v) == 8 {
			rev = int64(binary.BigEndian.Uint64(v))
		}
		return tx.CopyFile(tmp, 0o600)
	})
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("allocator: write last good copy %s: %w", dst, err)
	}
	s.copied = rev
	return nil
}

// scheduleLastGood arranges a last good copy soon. Called with s.mu held.
func (s *BoltStore) scheduleLastGood() {
	if s.copyTimer != nil {
		return
	}
	s.copyTimer = time.AfterFunc(lastGoodDelay, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.copyTimer = nil
		if s.cache == nil || s.copied == s.cache.rev {
			return
		}
		if err := s.writeLastGood(); err != nil {
			slog.Warn("allocator: cannot refresh the last good copy", "err", err)
		}
	})
}

// Snapshot implements Store.
func (s *BoltStore) Snapshot(ctx context.Context) (*Map, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache == nil {
		return nil, ErrClosed
	}
	return s.cache.snapshot(), nil
}

// Update implements Store. The file lock makes this process the only
// writer, so the in-memory map is always current and no conflict arises.
func (s *BoltStore) Update(ctx context.Context, fn func(*Map) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.cache
	if m == nil {
		return ErrClosed
	}
	m.begin()
	if err := fn(m); err != nil {
		clear(m.changes)
		return err
	}
	if !m.dirty() {
		return nil
	}
	rev := m.rev + 1
	err := s.db.Update(func(tx *bolt.Tx) error {
		mb, sb := tx.Bucket(boltMeta), tx.Bucket(boltServices)
		if v := mb.Get(boltRevKey); len(v) == 8 && int64(binary.BigEndian.Uint64(v)) != m.rev {
			return fmt.Errorf("allocator: bbolt revision %d, expected %d: file changed under us", binary.BigEndian.Uint64(v), m.rev)
		}
		puts, err := encodeChanges(m.changes)
		if err != nil {
			return err
		}
		for _, c := range puts {
			if c.val == nil {
				if err := sb.Delete(c.key); err != nil {
					return err
				}
			} else if err := sb.Put(c.key, c.val); err != nil {
				return err
			}
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(rev))
		return mb.Put(boltRevKey, b[:])
	})
	if err != nil {
		clear(m.changes)
		return fmt.Errorf("allocator: commit: %w", err)
	}
	m.apply(rev)
	s.scheduleLastGood()
	return nil
}

// put is one record to write: its key and its encoded value, nil to
// delete the key.
type put struct{ key, val []byte }

// encodeChanges returns the changes as puts in key order: bbolt keeps a
// node's keys in a sorted slice, so random-order puts of a cold start's
// 50,000 records shift it quadratically; sorted ones append. The keys are
// cut from one buffer and sorted as substrings of one string copy of it;
// the values are appended to another buffer, in key order (bbolt keeps
// keys and values until the commit; a slice of an outgrown buffer stays
// valid). At 50,000 Services this and the puts took 120 ms of a 190 ms
// AssignAll when each key was a string of its own, looked up in a map
// for its name and then its record, and each value a json.Marshal.
func encodeChanges(changes map[model.ServiceName]*Record) ([]put, error) {
	type change struct {
		key string // a substring of all: keys[off:off+len(key)]
		off int
		r   *Record
	}
	n := 0
	for name := range changes {
		n += len(name.Namespace) + 1 + len(name.Name)
	}
	keys := make([]byte, 0, n)
	cs := make([]change, 0, len(changes))
	for name, r := range changes {
		cs = append(cs, change{off: len(keys), r: r})
		keys = appendServiceKey(keys, name)
	}
	all := string(keys)
	for i := range cs {
		end := len(all)
		if i+1 < len(cs) {
			end = cs[i+1].off
		}
		cs[i].key = all[cs[i].off:end]
	}
	slices.SortFunc(cs, func(a, b change) int { return strings.Compare(a.key, b.key) })
	out := make([]put, len(cs))
	vals := make([]byte, 0, 48*len(cs))
	for i, c := range cs {
		out[i].key = keys[c.off : c.off+len(c.key) : c.off+len(c.key)]
		if c.r != nil {
			v0 := len(vals)
			var err error
			if vals, err = appendRecord(vals, *c.r); err != nil {
				return nil, err
			}
			out[i].val = vals[v0:len(vals):len(vals)]
		}
	}
	return out, nil
}

// maxBatch lets one bbolt transaction (one fsync) carry every Service of
// a cold start: 10,000 new Services cost one fsync, not 100.
func (s *BoltStore) maxBatch() int { return 1 << 20 }

// Close refreshes the last good copy if commits happened since it was
// written, and closes the file.
func (s *BoltStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache == nil {
		return nil
	}
	if s.copyTimer != nil {
		s.copyTimer.Stop()
		s.copyTimer = nil
	}
	var err error
	if s.copied != s.cache.rev {
		err = s.writeLastGood()
	}
	s.cache = nil
	return errors.Join(err, s.db.Close())
}
