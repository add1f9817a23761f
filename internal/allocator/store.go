package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
)

// Store keeps the allocation Map durably.
//
// Update is the only way to change the map: it reads the latest map, runs
// fn on it and commits fn's changes iff nobody committed in between
// (compare-and-swap on the map's revision); on a conflict it re-reads and
// runs fn again, so fn must derive everything from the Map it is given and
// may run several times. fn returning an error aborts the update and
// nothing is written; that error is returned as is. Transient backend
// errors (etcd unreachable) are retried until ctx is done.
//
// Snapshot returns the latest committed map, detached from the store.
type Store interface {
	Snapshot(ctx context.Context) (*Map, error)
	Update(ctx context.Context, fn func(*Map) error) error
	Close() error
}

// ErrClosed is returned by a Store used after Close.
var ErrClosed = errors.New("allocator: store closed")

// DefaultStateFile is the bbolt file OpenStore uses under the state dir.
const DefaultStateFile = "allocations.db"

// OpenStore opens the store named by registry (the --registry flag):
// "" is a bbolt file DefaultStateFile under stateDir (created if needed);
// "etcd://host:port[,host:port...]" is an etcd cluster (plain HTTP, key
// prefix /vipproxy/allocator/), shared by every vipproxy host that names
// it; its retry messages go to slog.Default(). Other values are an error.
// Opening etcd waits until the map is read or ctx ends.
func OpenStore(ctx context.Context, registry, stateDir string) (Store, error) {
	switch {
	case registry == "":
		if stateDir == "" {
			return nil, errors.New("allocator: --state-dir is required for the embedded store")
		}
		return OpenBolt(filepath.Join(stateDir, DefaultStateFile))
	case strings.HasPrefix(registry, "etcd://"):
		var eps []string
		for _, hp := range strings.Split(strings.TrimPrefix(registry, "etcd://"), ",") {
			hp = strings.TrimSpace(hp)
			if hp == "" || strings.ContainsAny(hp, "/?#") {
				return nil, fmt.Errorf("allocator: --registry %q: bad endpoint %q (want etcd://host:port[,host:port])", registry, hp)
			}
			eps = append(eps, hp)
		}
		return OpenEtcd(ctx, EtcdOptions{Endpoints: eps, Logger: slog.Default()})
	default:
		return nil, fmt.Errorf("allocator: --registry %q: want \"\" (bbolt in the state dir) or etcd://host:port[,host:port]", registry)
	}
}
