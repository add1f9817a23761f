// Package portcache is the per-ServicePort cache the dataplanes share: a
// value built from a port is reused while the port is unchanged. Unchanged
// means the same pointer (the model passes an unchanged port on as the same
// pointer, and ports are read-only) or, for a port rebuilt with the same
// content, ServicePort.Equal; and the cache's generation is the one the
// value was built in (a dataplane bumps it when what its values also depend
// on changes: options, NodePort addresses). The cache keeps the port
// pointer, never a copy. The nftables (fragments per family), iptables
// (rules per family) and ipvs (virtual-server input) modes use it; the
// userspace mode keeps live listeners, not values built from a port.
package portcache

import "github.com/vipproxy/vipproxy/internal/model"

// Cache maps a key (the port's name, perhaps with a family) to the value
// built from the port. The zero value is ready. It is not safe for
// concurrent use.
type Cache[K comparable, V any] struct {
	m   map[K]*entry[V]
	gen uint64
}

type entry[V any] struct {
	sp   *model.ServicePort
	gen  uint64
	v    V
	seen bool
}

// Get returns the value cached for k when sp is unchanged since it was
// built, else build(sp), which it caches. Either way k is marked seen.
func (c *Cache[K, V]) Get(k K, sp *model.ServicePort, build func(*model.ServicePort) V) V {
	if v, ok := c.Lookup(k, sp); ok {
		return v
	}
	v := build(sp)
	c.Put(k, sp, v)
	return v
}

// Lookup returns the value cached for k when sp is unchanged since it was
// built, marking k seen; ok is false otherwise. With Put it splits Get for
// callers that build the missing values concurrently.
func (c *Cache[K, V]) Lookup(k K, sp *model.ServicePort) (v V, ok bool) {
	if e := c.m[k]; e != nil && e.gen == c.gen && (e.sp == sp || e.sp.Equal(sp)) {
		e.sp, e.seen = sp, true
		return e.v, true
	}
	return v, false
}

// Previous returns the value cached for k, whether or not it is current:
// a builder may reuse what did not change.
func (c *Cache[K, V]) Previous(k K) (v V, ok bool) {
	if e := c.m[k]; e != nil {
		return e.v, true
	}
	return v, false
}

// Put caches v, built from sp, for k and marks k seen.
func (c *Cache[K, V]) Put(k K, sp *model.ServicePort, v V) {
	if c.m == nil {
		c.m = map[K]*entry[V]{}
	}
	c.m[k] = &entry[V]{sp: sp, gen: c.gen, v: v, seen: true}
}

// Delete drops k's entry, for callers that learn of a gone port without a
// pass over every port.
func (c *Cache[K, V]) Delete(k K) { delete(c.m, k) }

// Invalidate makes every cached value stale: the next Get of each builds
// again.
func (c *Cache[K, V]) Invalidate() { c.gen++ }

// Sweep drops the entries not marked seen since the last Sweep and clears
// the marks: call it after a pass over every port of a State.
func (c *Cache[K, V]) Sweep() {
	for k, e := range c.m {
		if !e.seen {
			delete(c.m, k)
			continue
		}
		e.seen = false
	}
}

// Len returns the number of entries.
func (c *Cache[K, V]) Len() int { return len(c.m) }
