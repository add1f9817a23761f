package allocator

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
type BoltStore struct {
	db *bolt.DB

	mu    sync.Mutex
	cache *Map // committed map, valid while the file is ours
}

// OpenBolt opens (creating if needed) the bbolt file at path.
func OpenBolt(path string) (*BoltStore, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("allocator: state dir: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("allocator: open %s: %w", path, err)
	}
	s := &BoltStore{db: db}
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
		err = sb.ForEach(func(k, v []byte) error {
			n, err := parseServiceKey(string(k))
			if err != nil {
				return err
			}
			r, err := decodeRecord(v)
			if err != nil {
				return fmt.Errorf("service %s: %w", n, err)
			}
			base[n] = r
			return nil
		})
		s.cache = newMap(rev, base)
		return err
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("allocator: load %s: %w", path, err)
	}
	return s, nil
}

// Snapshot implements Store.
func (s *BoltStore) Snapshot(ctx context.Context) (*Map, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache == nil {
		return nil, ErrClosed
	}
	return s.cache.copy(), nil
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
		// In key order: bbolt keeps a node's keys in a sorted slice, so
		// random-order puts of a cold start's 50,000 records shift it
		// quadratically; sorted ones append.
		keys := make([]string, 0, len(m.changes))
		names := make(map[string]model.ServiceName, len(m.changes))
		for n := range m.changes {
			k := serviceKey(n)
			keys = append(keys, k)
			names[k] = n
		}
		slices.Sort(keys)
		for _, key := range keys {
			r := m.changes[names[key]]
			k := []byte(key)
			if r == nil {
				if err := sb.Delete(k); err != nil {
					return err
				}
				continue
			}
			v, err := encodeRecord(*r)
			if err != nil {
				return err
			}
			if err := sb.Put(k, v); err != nil {
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
	return nil
}

// maxBatch lets one bbolt transaction (one fsync) carry every Service of
// a cold start: 10,000 new Services cost one fsync, not 100.
func (s *BoltStore) maxBatch() int { return 1 << 20 }

// Close closes the file.
func (s *BoltStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache == nil {
		return nil
	}
	s.cache = nil
	return s.db.Close()
}
