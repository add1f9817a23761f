package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/vipproxy/vipproxy/internal/model"
)

// EtcdOptions configures OpenEtcd.
type EtcdOptions struct {
	// Endpoints are host:port pairs (plain HTTP).
	Endpoints []string
	// Prefix is the key prefix of the map; default "/vipproxy/allocator/".
	Prefix string
	// AttemptTimeout bounds one etcd call; default 5s.
	AttemptTimeout time.Duration
	// Logger receives retry and reconnect messages; nil discards them.
	Logger *slog.Logger
}

// EtcdStore is a Store in etcd, shared by every host that opens the same
// endpoints and prefix.
//
// Layout: one key per Service (<prefix>services/<ns>/<name>, a JSON
// Record) and one revision key (<prefix>revision). Every Update is one
// etcd transaction that compares the revision key's ModRevision with the
// revision the update was computed from and, if equal, writes the changed
// records and the revision key together; so two hosts racing for the same
// Service or IP end with exactly one winner, and the loser recomputes on
// the winner's map. A watch keeps a local copy of the map current, so a
// conflict costs no re-read of the whole map.
type EtcdStore struct {
	cli     *clientv3.Client
	prefix  string
	svcPfx  string
	revKey  string
	timeout time.Duration
	log     *slog.Logger
	writer  string

	mu          sync.Mutex
	cache       *Map  // rev = ModRevision of revKey
	skipThrough int64 // watch events at or below this revision are already in cache
	watchFrom   int64 // next revision the watch should start at after a restart
	changed     chan struct{}
	closed      bool

	stop context.CancelFunc
	done chan struct{}

	// Transactions sent and lost to a concurrent writer (for tests and
	// benchmarks).
	statAttempts, statConflicts atomic.Int64
}

// OpenEtcd connects to etcd, loads the map and starts the watch that
// keeps it current. It fails when the map cannot be read before ctx ends.
func OpenEtcd(ctx context.Context, opts EtcdOptions) (*EtcdStore, error) {
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("allocator: etcd: no endpoints")
	}
	if opts.Prefix == "" {
		opts.Prefix = "/vipproxy/allocator/"
	}
	if !strings.HasSuffix(opts.Prefix, "/") {
		opts.Prefix += "/"
	}
	if opts.AttemptTimeout <= 0 {
		opts.AttemptTimeout = 5 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   opts.Endpoints,
		DialTimeout: opts.AttemptTimeout,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("allocator: etcd %v: %w", opts.Endpoints, err)
	}
	host, _ := os.Hostname()
	s := &EtcdStore{
		cli:     cli,
		prefix:  opts.Prefix,
		svcPfx:  opts.Prefix + "services/",
		revKey:  opts.Prefix + "revision",
		timeout: opts.AttemptTimeout,
		log:     log.With("store", "etcd"),
		writer:  fmt.Sprintf("%s/%d", host, os.Getpid()),
		changed: make(chan struct{}),
		done:    make(chan struct{}),
	}
	for {
		err = s.reload(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			cli.Close()
			return nil, fmt.Errorf("allocator: etcd %v: load map: %w", opts.Endpoints, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	wctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	go s.watch(wctx)
	return s, nil
}

// reload reads the whole map and replaces the cache.
func (s *EtcdStore) reload(ctx context.Context) error {
	tctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	resp, err := s.cli.Get(tctx, s.prefix, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	base := map[model.ServiceName]Record{}
	var rev int64
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if k == s.revKey {
			rev = kv.ModRevision
			continue
		}
		n, r, ok := s.decode(kv.Key, kv.Value)
		if ok {
			base[n] = r
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cache = newMap(rev, base)
	s.skipThrough = max(s.skipThrough, resp.Header.Revision)
	s.watchFrom = max(s.watchFrom, resp.Header.Revision+1)
	s.notifyLocked()
	return nil
}

func (s *EtcdStore) decode(key, value []byte) (model.ServiceName, Record, bool) {
	k, ok := strings.CutPrefix(string(key), s.svcPfx)
	if !ok {
		return model.ServiceName{}, Record{}, false
	}
	n, err := parseServiceKey(k)
	if err != nil {
		s.log.Error("ignoring malformed key in the allocation map", "key", string(key), "err", err)
		return model.ServiceName{}, Record{}, false
	}
	r, err := decodeRecord(value)
	if err != nil {
		s.log.Error("ignoring malformed record in the allocation map", "service", n.String(), "err", err)
		return model.ServiceName{}, Record{}, false
	}
	return n, r, true
}

func (s *EtcdStore) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// watch applies other writers' commits to the cache until ctx ends.
func (s *EtcdStore) watch(ctx context.Context) {
	defer close(s.done)
	for ctx.Err() == nil {
		s.mu.Lock()
		from := s.watchFrom
		s.mu.Unlock()
		wch := s.cli.Watch(ctx, s.prefix, clientv3.WithPrefix(), clientv3.WithRev(from))
		for resp := range wch {
			if resp.CompactRevision != 0 || resp.Err() != nil {
				s.log.Warn("allocation map watch broken; reloading", "err", resp.Err(), "compactRevision", resp.CompactRevision)
				break
			}
			s.mu.Lock()
			for _, ev := range resp.Events {
				kv := ev.Kv
				s.watchFrom = max(s.watchFrom, kv.ModRevision+1)
				if kv.ModRevision <= s.skipThrough {
					continue
				}
				if string(kv.Key) == s.revKey {
					if ev.Type == clientv3.EventTypePut {
						s.cache.rev = max(s.cache.rev, kv.ModRevision)
					}
					continue
				}
				k, ok := strings.CutPrefix(string(kv.Key), s.svcPfx)
				if !ok {
					continue
				}
				s.cache.own(0) // a snapshot may share base
				if ev.Type == clientv3.EventTypeDelete {
					if n, err := parseServiceKey(k); err == nil {
						delete(s.cache.base, n)
					}
					continue
				}
				if n, r, ok := s.decode(kv.Key, kv.Value); ok {
					s.cache.base[n] = r
				}
			}
			s.notifyLocked()
			s.mu.Unlock()
		}
		if ctx.Err() != nil {
			return
		}
		for ctx.Err() == nil {
			if err := s.reload(ctx); err == nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
}

// Snapshot implements Store. It returns this host's copy of the map,
// which lags other hosts' commits by the watch delay.
func (s *EtcdStore) Snapshot(ctx context.Context) (*Map, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	return s.cache.snapshot(), nil
}

// Update implements Store.
func (s *EtcdStore) Update(ctx context.Context, fn func(*Map) error) error {
	backoff := 20 * time.Millisecond
	conflicts := 0
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return ErrClosed
		}
		m := s.cache
		m.begin()
		fnErr := fn(m)
		if fnErr != nil || !m.dirty() {
			// Nothing to write, but the verdict (an error such as "already
			// allocated", or "nothing changes") may come from a copy that
			// lags a commit of another host: it stands only if the map is
			// still at the revision fn saw.
			clear(m.changes)
			expect := m.rev
			s.mu.Unlock()
			current, target, err := s.current(ctx, expect)
			if err != nil {
				if permanent(err) || ctx.Err() != nil {
					return fmt.Errorf("allocator: etcd: %w", err)
				}
				s.log.Warn("allocation map check failed; retrying", "attempt", attempt, "err", err)
				if !sleepCtx(ctx, backoff) {
					return ctx.Err()
				}
				backoff = min(backoff*2, time.Second)
				continue
			}
			if current {
				return fnErr
			}
			if err := s.waitFor(ctx, target); err != nil {
				return err
			}
			continue
		}
		if len(m.changes) >= maxTxnOps {
			n := len(m.changes)
			clear(m.changes)
			s.mu.Unlock()
			return fmt.Errorf("allocator: etcd: %d changes in one update, at most %d fit a transaction", n, maxTxnOps-1)
		}
		expect := m.rev
		ops := make([]clientv3.Op, 0, len(m.changes)+1)
		for n, r := range m.changes {
			k := s.svcPfx + serviceKey(n)
			if r == nil {
				ops = append(ops, clientv3.OpDelete(k))
				continue
			}
			v, err := encodeRecord(*r)
			if err != nil {
				clear(m.changes)
				s.mu.Unlock()
				return fmt.Errorf("allocator: encode %s: %w", n, err)
			}
			ops = append(ops, clientv3.OpPut(k, string(v)))
		}
		ops = append(ops, clientv3.OpPut(s.revKey, s.writer))
		s.statAttempts.Add(1)
		tctx, cancel := context.WithTimeout(ctx, s.timeout)
		resp, err := s.cli.Txn(tctx).
			If(clientv3.Compare(clientv3.ModRevision(s.revKey), "=", expect)).
			Then(ops...).
			Else(clientv3.OpGet(s.revKey)).
			Commit()
		cancel()
		if err == nil && resp.Succeeded {
			m.apply(resp.Header.Revision)
			s.skipThrough = max(s.skipThrough, resp.Header.Revision)
			s.notifyLocked()
			s.mu.Unlock()
			return nil
		}
		clear(m.changes)
		s.mu.Unlock()
		if err != nil && permanent(err) {
			return fmt.Errorf("allocator: etcd: %w", err)
		}
		if err != nil {
			// Unreachable, timed out, or an unknown outcome: retry. If the
			// commit did land, the compare fails next time and fn re-runs
			// on a map that already holds its result.
			s.log.Warn("allocation map update failed; retrying", "attempt", attempt, "err", err)
			if !sleepCtx(ctx, backoff) {
				return ctx.Err()
			}
			backoff = min(backoff*2, time.Second)
			continue
		}
		// Conflict: wait until the watch brought the winner's commit.
		var target int64
		if rr := resp.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
			target = rr.Kvs[0].ModRevision
		}
		s.statConflicts.Add(1)
		conflicts++
		if err := s.waitFor(ctx, target); err != nil {
			return err
		}
		// Back off a random while, growing with repeated conflicts, so
		// racing hosts stop proposing doomed transactions in lockstep
		// (each one costs etcd a raft round).
		if !sleepCtx(ctx, time.Duration(rand.Int64N(int64(min(conflicts, 8))*int64(2*time.Millisecond)))) {
			return ctx.Err()
		}
	}
}

// current reports whether the map is still at revision rev (a
// linearizable read of the revision key), and if not, its revision.
func (s *EtcdStore) current(ctx context.Context, rev int64) (bool, int64, error) {
	tctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	resp, err := s.cli.Get(tctx, s.revKey)
	if err != nil {
		return false, 0, err
	}
	var now int64
	if len(resp.Kvs) > 0 {
		now = resp.Kvs[0].ModRevision
	}
	return now == rev, now, nil
}

// waitFor waits until the cache holds map revision target; after a second
// without progress it reloads the map.
func (s *EtcdStore) waitFor(ctx context.Context, target int64) error {
	if target == 0 {
		// The revision key is gone (deleted by hand): start over from etcd.
		return s.reload(ctx)
	}
	deadline := time.NewTimer(time.Second)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		cur := s.cache.rev
		if cur >= target {
			s.mu.Unlock()
			return nil
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		case <-deadline.C:
			s.log.Warn("allocation map watch lagging; reloading", "have", cur, "want", target)
			if err := s.reload(ctx); err != nil {
				s.log.Warn("allocation map reload failed", "err", err)
			}
			return nil
		}
	}
}

// Close stops the watch and closes the client.
func (s *EtcdStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.stop()
	<-s.done
	return s.cli.Close()
}

// maxTxnOps is etcd's default --max-txn-ops.
const maxTxnOps = 128

// permanent reports whether retrying err cannot help (the request itself
// is refused), as opposed to etcd being unreachable or slow.
func permanent(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition, codes.OutOfRange:
		return true
	}
	return false
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
