package manifests

// The decode cache: what decoding each file gave, kept in a file (in
// vipproxy's state directory) so that a restart over unchanged manifests
// skips the YAML. At 50,000 Services the decode was 0.44 s of a 1 s
// restart; the cache reads back in a fraction of it.
//
// A file's decode is used only for the same name and content (its
// SHA-256, which read computes anyway) under the same Options.CacheVersion
// (vipproxy passes its executable's identity, so a new build, which may
// decode differently, never reads an older build's cache) and NodeName.
// The cache is an optimisation only: a cache that is missing, of another
// version, truncated or corrupt is ignored (the files are decoded), and a
// failure to write it is logged. It is written once per run, a while
// after the first snapshot (so as not to compete with the first sync),
// holding the files of that first read.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

// cacheMagic starts a cache file; cacheFormat changes with the encoding.
const (
	cacheMagic  = "vipproxy manifests cache\n"
	cacheFormat = 1
)

// cacheTemp starts the name of a cache being written.
const cacheTemp = ".manifests-cache-"

// cacheDelay is how long after the first snapshot the cache is written.
var cacheDelay = 10 * time.Second

// cacheKey identifies a file's content.
type cacheKey struct {
	name string
	sum  [sha256.Size]byte
}

// cacheFile is a loaded cache: each file's encoded decode, to be decoded
// when read finds the same content (on read's goroutines).
type cacheFile struct {
	records map[cacheKey][]byte
}

// cacheHeader is what a cache must start with to be used.
func (s *Source) cacheHeader() []byte {
	b := []byte(cacheMagic)
	b = binary.AppendUvarint(b, cacheFormat)
	b = appendString(b, s.opts.CacheVersion)
	return appendString(b, s.opts.NodeName)
}

// loadCache reads the cache file, or returns nil when there is none to
// use (logged when it exists but cannot be used).
func (s *Source) loadCache() *cacheFile {
	if s.opts.CacheFile == "" || s.opts.CacheVersion == "" {
		return nil
	}
	data, err := os.ReadFile(s.opts.CacheFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		s.log.Warn("manifest cache unreadable; decoding every file", "err", err)
		return nil
	}
	head := s.cacheHeader()
	if !bytes.HasPrefix(data, head) {
		s.log.Info("manifest cache of another build or node; decoding every file", "cache", s.opts.CacheFile)
		return nil
	}
	r := &reader{b: data[len(head):]}
	c := &cacheFile{records: map[cacheKey][]byte{}}
	for n := r.uvarint(); n > 0 && r.err == nil; n-- {
		var k cacheKey
		k.name = r.string()
		copy(k.sum[:], r.bytes(sha256.Size))
		c.records[k] = r.bytes(int(r.uvarint()))
	}
	if r.err != nil || len(r.b) != 0 {
		s.log.Warn("manifest cache corrupt; decoding every file", "cache", s.opts.CacheFile)
		return nil
	}
	return c
}

// lookup returns the decode of file name with content sum, if cached and
// readable.
func (c *cacheFile) lookup(name string, sum [sha256.Size]byte) ([]entry, bool) {
	if c == nil {
		return nil, false
	}
	rec, ok := c.records[cacheKey{name, sum}]
	if !ok {
		return nil, false
	}
	r := &reader{b: rec}
	entries := r.entries()
	if r.err != nil || len(r.b) != 0 {
		return nil, false
	}
	return entries, true
}

// cachedFile is one file of a first read, for writeCache.
type cachedFile struct {
	key     cacheKey
	entries []entry
}

// writeCache writes files to the cache file, atomically (a temporary
// file renamed over it).
func (s *Source) writeCache(files []cachedFile) error {
	dir := filepath.Dir(s.opts.CacheFile)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("manifest cache: %w", err)
	}
	// What a write cut short by the process's end left behind.
	old, _ := filepath.Glob(filepath.Join(dir, cacheTemp+"*"))
	for _, f := range old {
		os.Remove(f)
	}
	tmp, err := os.CreateTemp(dir, cacheTemp+"*")
	if err != nil {
		return fmt.Errorf("manifest cache: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	w := bufio.NewWriterSize(tmp, 1<<16)
	b := binary.AppendUvarint(s.cacheHeader(), uint64(len(files)))
	var rec []byte
	for _, f := range files {
		b = appendString(b, f.key.name)
		b = append(b, f.key.sum[:]...)
		rec = appendEntries(rec[:0], f.entries)
		b = binary.AppendUvarint(b, uint64(len(rec)))
		w.Write(b) // a write error sticks: Flush returns it
		w.Write(rec)
		b = b[:0]
	}
	err = errors.Join(w.Flush(), tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), s.opts.CacheFile)
	}
	if err != nil {
		return fmt.Errorf("manifest cache: %w", err)
	}
	return nil
}

// The encoding: unsigned integers as uvarints, signed ones zigzagged,
// strings and byte runs after their length, slices and maps after their
// length plus one (0 is nil), addresses and prefixes in their binary
// form, a Loc as its Parts.

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// appendLen appends the length of a slice or map, 0 for nil.
func appendLen(b []byte, n int, isNil bool) []byte {
	if isNil {
		return append(b, 0)
	}
	return binary.AppendUvarint(b, uint64(n)+1)
}

func appendAddrs(b []byte, as []netip.Addr) []byte {
	b = appendLen(b, len(as), as == nil)
	for _, a := range as {
		b = appendAddr(b, a)
	}
	return b
}

func appendAddr(b []byte, a netip.Addr) []byte {
	ab, _ := a.MarshalBinary() // never fails
	return appendString(b, string(ab))
}

func appendPrefixes(b []byte, ps []netip.Prefix) []byte {
	b = appendLen(b, len(ps), ps == nil)
	for _, p := range ps {
		pb, _ := p.MarshalBinary() // never fails
		b = appendString(b, string(pb))
	}
	return b
}

func appendProblems(b []byte, ps []model.Problem) []byte {
	b = appendLen(b, len(ps), ps == nil)
	for _, p := range ps {
		b = appendString(b, p.Object)
		b = appendString(b, p.Field)
		b = appendString(b, p.Value)
		b = appendString(b, p.Reason)
		b = appendString(b, p.File)
	}
	return b
}

// The kinds of an entry's object.
const (
	objNone byte = iota
	objService
	objSlice
	objNode
)

func appendEntries(b []byte, es []entry) []byte {
	b = appendLen(b, len(es), es == nil)
	for i := range es {
		e := &es[i]
		b = binary.AppendVarint(b, int64(e.where.doc))
		b = binary.AppendVarint(b, int64(e.where.item))
		b = appendString(b, e.key.Kind)
		b = appendString(b, e.key.Namespace)
		b = appendString(b, e.key.Name)
		switch {
		case e.svc != nil:
			b = appendService(append(b, objService), e.svc)
		case e.slice != nil:
			b = appendSlice(append(b, objSlice), e.slice)
		case e.node != nil:
			b = appendNode(append(b, objNode), e.node)
		default:
			b = append(b, objNone)
		}
		b = appendProblems(b, e.problems)
	}
	return b
}

func appendService(b []byte, s *model.Service) []byte {
	b = appendString(b, s.Namespace)
	b = appendString(b, s.Name)
	b = appendString(b, string(s.Type))
	b = appendAddrs(b, s.ClusterIPs)
	b = appendLen(b, len(s.IPFamilies), s.IPFamilies == nil)
	for _, f := range s.IPFamilies {
		b = appendString(b, string(f))
	}
	b = appendString(b, s.IPFamilyPolicy)
	b = appendAddrs(b, s.ExternalIPs)
	b = appendAddrs(b, s.LoadBalancerIPs)
	b = appendPrefixes(b, s.LoadBalancerSourceRanges)
	b = binary.AppendVarint(b, int64(s.AffinityTimeoutSeconds))
	b = appendString(b, string(s.ExternalTrafficPolicy))
	b = appendString(b, string(s.InternalTrafficPolicy))
	b = binary.AppendUvarint(b, uint64(s.HealthCheckNodePort))
	b = appendBool(b, s.Headless)
	b = appendString(b, s.TrafficDistribution)
	b = appendString(b, string(s.Balance))
	b = appendString(b, s.OutlierEjection)
	b = binary.AppendVarint(b, int64(s.SlowStart))
	b = binary.AppendVarint(b, int64(s.DrainReset))
	b = appendLen(b, len(s.Ports), s.Ports == nil)
	for _, p := range s.Ports {
		b = appendString(b, p.Name)
		b = appendString(b, string(p.Protocol))
		b = binary.AppendUvarint(b, uint64(p.Port))
		b = binary.AppendUvarint(b, uint64(p.NodePort))
	}
	return b
}

func appendSlice(b []byte, sl *model.EndpointSlice) []byte {
	b = appendString(b, sl.Name)
	b = appendString(b, sl.Service.Namespace)
	b = appendString(b, sl.Service.Name)
	b = appendString(b, string(sl.AddressType))
	b = appendLen(b, len(sl.Ports), sl.Ports == nil)
	for _, p := range sl.Ports {
		b = appendString(b, p.Name)
		b = appendString(b, string(p.Protocol))
		b = binary.AppendUvarint(b, uint64(p.Port))
	}
	b = appendLen(b, len(sl.Endpoints), sl.Endpoints == nil)
	for i := range sl.Endpoints {
		e := &sl.Endpoints[i]
		b = appendAddr(b, e.Address)
		var flags byte
		if e.Ready {
			flags |= flagReady
		}
		if e.Serving {
			flags |= flagServing
		}
		if e.Terminating {
			flags |= flagTerminating
		}
		sameLoc := i > 0 && e.Loc == sl.Endpoints[i-1].Loc
		if sameLoc {
			flags |= flagSameLoc
		}
		b = append(b, flags, e.Weight)
		if !sameLoc {
			node, zone, zones, nodes := e.Loc.Parts()
			b = appendString(b, node)
			b = appendString(b, zone)
			b = appendString(b, zones)
			b = appendString(b, nodes)
		}
	}
	return b
}

// An endpoint's flags; flagSameLoc says its Loc is the previous one's,
// which is then not repeated (a slice's endpoints mostly share one).
const (
	flagReady byte = 1 << iota
	flagServing
	flagTerminating
	flagSameLoc
)

func appendNode(b []byte, n *model.Node) []byte {
	b = appendString(b, n.Name)
	b = appendLen(b, len(n.Labels), n.Labels == nil)
	for k, v := range n.Labels {
		b = appendString(b, k)
		b = appendString(b, v)
	}
	b = appendAddrs(b, n.Addresses)
	b = appendPrefixes(b, n.PodCIDRs)
	b = appendBool(b, n.Deleting)
	return appendBool(b, n.ToBeDeleted)
}

// reader decodes; the first error sticks and every later read returns
// zero values.
type reader struct {
	b   []byte
	err error
	// strs interns the strings of one record (namespaces, node names,
	// port names and protocols repeat).
	strs map[string]string
	// lastLoc and its parts: endpoints of a slice mostly share one.
	lastParts [4]string
	lastLoc   model.Loc
}

var errCorrupt = errors.New("corrupt")

func (r *reader) fail() {
	if r.err == nil {
		r.err = errCorrupt
	}
	r.b = nil
}

func (r *reader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

// varint reads what binary.AppendVarint wrote: a zigzag uvarint.
func (r *reader) varint() int64 {
	ux := r.uvarint()
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x
}

// small reads a uvarint that must fit max.
func (r *reader) small(max uint64) uint64 {
	v := r.uvarint()
	if v > max {
		r.fail()
		return 0
	}
	return v
}

func (r *reader) bytes(n int) []byte {
	if n < 0 || n > len(r.b) {
		r.fail()
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) byte() byte {
	if b := r.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) bool() bool {
	switch r.byte() {
	case 0:
		return false
	case 1:
		return true
	}
	r.fail()
	return false
}

// raw reads a string's bytes.
func (r *reader) raw() []byte { return r.bytes(int(r.small(math.MaxInt32))) }

// string reads a string, interned within the reader: a file's names
// repeat (namespaces, node names, ports, protocols, and an object's name
// in its key), and the YAML decode shares them too.
func (r *reader) string() string { return r.intern(r.raw()) }

func (r *reader) intern(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if s, ok := r.strs[string(b)]; ok { // no allocation for the lookup
		return s
	}
	if r.strs == nil {
		r.strs = map[string]string{}
	}
	s := string(b)
	r.strs[s] = s
	return s
}

// length reads a slice or map length: -1 for nil. A length cannot exceed
// the bytes left (every element takes at least one).
func (r *reader) length() int {
	n := r.uvarint()
	if n == 0 {
		return -1
	}
	if n-1 > uint64(len(r.b)) {
		r.fail()
		return -1
	}
	return int(n - 1)
}

func (r *reader) addr() netip.Addr {
	var a netip.Addr
	if err := a.UnmarshalBinary(r.bytes(int(r.small(math.MaxUint8)))); err != nil {
		r.fail()
	}
	return a
}

// readList reads a slice written after appendLen, one element by one.
func readList[T any](r *reader, one func() T) []T {
	n := r.length()
	if n < 0 {
		return nil
	}
	out := make([]T, n)
	for i := range out {
		out[i] = one()
	}
	return out
}

func (r *reader) addrs() []netip.Addr { return readList(r, r.addr) }

func (r *reader) prefixes() []netip.Prefix {
	return readList(r, func() netip.Prefix {
		var p netip.Prefix
		if err := p.UnmarshalBinary(r.bytes(int(r.small(math.MaxUint8)))); err != nil {
			r.fail()
		}
		return p
	})
}

func (r *reader) problems() []model.Problem {
	return readList(r, func() model.Problem {
		return model.Problem{Object: r.string(), Field: r.string(), Value: r.string(), Reason: r.string(), File: r.string()}
	})
}

func (r *reader) entries() []entry {
	n := r.length()
	if n < 0 {
		return nil
	}
	out := make([]entry, n)
	for i := range out {
		e := &out[i]
		e.where = place{doc: int32(r.varint()), item: int32(r.varint())}
		e.key = objKey{Kind: r.string(), Namespace: r.string(), Name: r.string()}
		switch r.byte() {
		case objNone:
		case objService:
			e.svc = r.service()
		case objSlice:
			e.slice = r.slice()
		case objNode:
			e.node = r.node()
		default:
			r.fail()
		}
		e.problems = r.problems()
		if r.err != nil {
			return nil
		}
	}
	return out
}

func (r *reader) service() *model.Service {
	s := &model.Service{}
	s.Namespace, s.Name = r.string(), r.string()
	s.Type = model.ServiceType(r.string())
	s.ClusterIPs = r.addrs()
	s.IPFamilies = readList(r, func() model.AddressType { return model.AddressType(r.string()) })
	s.IPFamilyPolicy = r.string()
	s.ExternalIPs = r.addrs()
	s.LoadBalancerIPs = r.addrs()
	s.LoadBalancerSourceRanges = r.prefixes()
	s.AffinityTimeoutSeconds = int(r.varint())
	s.ExternalTrafficPolicy = model.TrafficPolicy(r.string())
	s.InternalTrafficPolicy = model.TrafficPolicy(r.string())
	s.HealthCheckNodePort = uint16(r.small(math.MaxUint16))
	s.Headless = r.bool()
	s.TrafficDistribution = r.string()
	s.Balance = model.Balance(r.string())
	s.OutlierEjection = r.string()
	s.SlowStart = time.Duration(r.varint())
	s.DrainReset = time.Duration(r.varint())
	s.Ports = readList(r, func() model.ServicePortSpec {
		return model.ServicePortSpec{Name: r.string(), Protocol: model.Protocol(r.string()),
			Port: uint16(r.small(math.MaxUint16)), NodePort: uint16(r.small(math.MaxUint16))}
	})
	return s
}

func (r *reader) slice() *model.EndpointSlice {
	sl := &model.EndpointSlice{Name: r.string()}
	sl.Service = model.ServiceName{Namespace: r.string(), Name: r.string()}
	sl.AddressType = model.AddressType(r.string())
	sl.Ports = readList(r, func() model.EndpointPort {
		return model.EndpointPort{Name: r.string(), Protocol: model.Protocol(r.string()), Port: uint16(r.small(math.MaxUint16))}
	})
	if n := r.length(); n >= 0 {
		sl.Endpoints = make([]model.SliceEndpoint, n)
		for i := range sl.Endpoints {
			e := &sl.Endpoints[i]
			e.Address = r.addr()
			flags := r.byte()
			if flags >= flagSameLoc<<1 || (i == 0 && flags&flagSameLoc != 0) {
				r.fail()
				return nil
			}
			e.Ready, e.Serving, e.Terminating = flags&flagReady != 0, flags&flagServing != 0, flags&flagTerminating != 0
			e.Weight = r.byte()
			if flags&flagSameLoc != 0 {
				e.Loc = sl.Endpoints[i-1].Loc
				continue
			}
			node, zone, zones, nodes := r.raw(), r.raw(), r.raw(), r.raw()
			if p := &r.lastParts; string(node) != p[0] || string(zone) != p[1] || string(zones) != p[2] || string(nodes) != p[3] {
				*p = [4]string{r.intern(node), r.intern(zone), r.intern(zones), r.intern(nodes)}
				r.lastLoc = model.LocOf(p[0], p[1], p[2], p[3])
			}
			e.Loc = r.lastLoc
		}
	}
	return sl
}

func (r *reader) node() *model.Node {
	n := &model.Node{Name: r.string()}
	if k := r.length(); k >= 0 {
		n.Labels = make(map[string]string, k)
		for range k {
			key := r.string()
			n.Labels[key] = r.string()
		}
	}
	n.Addresses = r.addrs()
	n.PodCIDRs = r.prefixes()
	n.Deleting = r.bool()
	n.ToBeDeleted = r.bool()
	return n
}

// noteFirstRead keeps, on the first read with a cache file configured,
// what decoding each file gave, for scheduleCacheWrite.
func (s *Source) noteFirstRead(jobs []readJob) {
	if s.opts.CacheFile == "" || s.opts.CacheVersion == "" || s.snaps > 0 {
		return
	}
	for i := range jobs {
		j := &jobs[i]
		if j.err != nil || j.same {
			continue
		}
		// Every entry usable: good holds them (clipped), and keeping
		// decoded too would keep a second array until the write.
		entries := j.good
		if len(j.good) != len(j.decoded) {
			entries = j.decoded // a broken document's problems are cached too
		}
		s.firstRead = append(s.firstRead, cachedFile{cacheKey{j.name, j.sum}, entries})
		if j.cached {
			s.cacheHits++
		}
	}
	// Records of files gone or changed since: rewrite without them.
	s.cacheStale = s.cache != nil && len(s.cache.records) != s.cacheHits
	s.log.Info("manifest cache", "files", len(s.firstRead), "fromCache", s.cacheHits)
}

// scheduleCacheWrite keeps the first read's decode for writing, when the
// cache did not already hold exactly those files, and returns when Run
// should try to write it (nil: never).
func (s *Source) scheduleCacheWrite() <-chan time.Time {
	files, hits := s.firstRead, s.cacheHits
	s.firstRead = nil
	if len(files) == 0 || (hits == len(files) && !s.cacheStale) {
		return nil
	}
	s.cachePending = files
	return time.After(cacheDelay)
}

// cacheQuiet is how long no snapshot must have been sent before the
// cache is written: encoding it takes a CPU for tens of milliseconds (65
// ms at 50,000 Services), which a change being programmed should not
// share.
var cacheQuiet = 500 * time.Millisecond

// cacheWait returns how much longer to wait before writing the cache,
// the last snapshot having been sent at last; 0 means now.
func cacheWait(now, last time.Time) time.Duration {
	return max(cacheQuiet-now.Sub(last), 0)
}

// writeCacheNow writes what scheduleCacheWrite kept, on a goroutine of
// its own, and logs how it went.
func (s *Source) writeCacheNow() {
	files := s.cachePending
	s.cachePending = nil
	go func() {
		start := time.Now()
		if err := s.writeCache(files); err != nil {
			s.log.Warn("cannot write the manifest cache", "err", err)
			return
		}
		s.log.Info("manifest cache written", "files", len(files), "took", time.Since(start).Round(time.Millisecond))
	}()
}
