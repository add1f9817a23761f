package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/source"
)

// Default NodePort range (kube-apiserver's --service-node-port-range).
const (
	DefaultNodePortMin uint16 = 30000
	DefaultNodePortMax uint16 = 32767
)

// IP family policies (spec.ipFamilyPolicy).
const (
	SingleStack      = "SingleStack"
	PreferDualStack  = "PreferDualStack"
	RequireDualStack = "RequireDualStack"
)

// AssignerOptions configures NewAssigner.
type AssignerOptions struct {
	// Store holds the allocation map. Required.
	Store Store
	// ServiceCIDRs are the service-cluster-ip-range, at most one per IP
	// family; the first one's family is the default for Services that ask
	// for none. Required.
	ServiceCIDRs []netip.Prefix
	// NodePortRange is the inclusive NodePort range; zero means
	// 30000-32767.
	NodePortRange [2]uint16
	// StaticSubrange enables the static/dynamic band split of the IP and
	// NodePort ranges (upstream's ServiceIPStaticSubrange and
	// ServiceNodePortStaticSubrange gates, GA and on upstream: set it true
	// unless the gate is turned off). False: one shared pool.
	StaticSubrange bool
	// LeakThreshold is how many consecutive repair passes must see a
	// value leaked before it is released; 0 means 3.
	LeakThreshold int
	// Rand seeds dynamic allocation; nil picks a random seed.
	Rand *rand.Rand
	// Logger receives repair reports; nil discards.
	Logger *slog.Logger
}

// Assigner hands out ClusterIPs and NodePorts from the configured ranges,
// recording every value in the Store before the Service gets it. It
// implements source.Assigner and is safe for concurrent use; several
// Assigners on several hosts may share one etcd Store.
type Assigner struct {
	store     Store
	log       *slog.Logger
	threshold int

	mu       sync.Mutex // serializes updates; guards the fields below
	families []model.AddressType
	ips      map[model.AddressType]*IPRange
	ports    *PortRange
	assigned map[model.ServiceName]bool // names Assign/Release touched since the last repair pass began
	// The index of the map being updated: holders of each value and the
	// marks assignLocked made for the Service at hand.
	ipHolders   map[netip.Addr]int
	portHolders map[uint16]int
	// indexOK says the ranges and holders reflect the committed map at
	// revision indexRev, so the next update at that revision skips the
	// O(records) rebuild.
	indexOK     bool
	indexRev    int64
	markedIPs   []netip.Addr
	markedPorts []uint16
	leaks       map[model.ServiceName]int // consecutive passes a record was seen without a live Service
}

var _ source.Assigner = (*Assigner)(nil)

// NewAssigner validates opts and returns an Assigner. It fails when the
// store is missing, a CIDR is invalid or too small, two CIDRs share a
// family, or the NodePort range is invalid.
func NewAssigner(opts AssignerOptions) (*Assigner, error) {
	if opts.Store == nil {
		return nil, errors.New("allocator: no store")
	}
	if len(opts.ServiceCIDRs) == 0 || len(opts.ServiceCIDRs) > 2 {
		return nil, fmt.Errorf("allocator: want one or two service CIDRs (one per family), got %d", len(opts.ServiceCIDRs))
	}
	r := opts.Rand
	if r == nil {
		r = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	a := &Assigner{
		store:       opts.Store,
		log:         opts.Logger,
		threshold:   opts.LeakThreshold,
		ips:         map[model.AddressType]*IPRange{},
		assigned:    map[model.ServiceName]bool{},
		ipHolders:   map[netip.Addr]int{},
		portHolders: map[uint16]int{},
		leaks:       map[model.ServiceName]int{},
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.threshold <= 0 {
		a.threshold = 3
	}
	for _, p := range opts.ServiceCIDRs {
		fam := familyOf(p.Addr())
		if a.ips[fam] != nil {
			return nil, fmt.Errorf("allocator: service CIDRs %v and %v are both %s", a.ips[fam].Prefix(), p, fam)
		}
		ipr, err := NewIPRange(p, RangeOptions{StaticSubrange: opts.StaticSubrange, Rand: r})
		if err != nil {
			return nil, err
		}
		a.ips[fam] = ipr
		a.families = append(a.families, fam)
	}
	lo, hi := opts.NodePortRange[0], opts.NodePortRange[1]
	if lo == 0 && hi == 0 {
		lo, hi = DefaultNodePortMin, DefaultNodePortMax
	}
	pr, err := NewPortRange(lo, hi, RangeOptions{StaticSubrange: opts.StaticSubrange, Rand: r})
	if err != nil {
		return nil, err
	}
	a.ports = pr
	return a, nil
}

func familyOf(ip netip.Addr) model.AddressType {
	if ip.Is4() {
		return model.IPv4
	}
	return model.IPv6
}

// AssignError is a refused Service field. It unwraps to the allocator
// error behind it (ErrAllocated, *ErrNotInRange, ErrFull) when there is one.
type AssignError struct {
	Service model.ServiceName
	Field   string // "spec.clusterIP", "spec.ports[1].nodePort", ...
	Value   string // the bad value, "" when none was given
	Err     error
}

func (e *AssignError) Error() string {
	s := "Service " + e.Service.String() + ": " + e.Field
	if e.Value != "" {
		s += " " + strconv.Quote(e.Value)
	}
	return s + ": " + e.Err.Error()
}

func (e *AssignError) Unwrap() error { return e.Err }

// wantsIPs reports whether svc gets ClusterIPs at all.
func wantsIPs(svc *model.Service) bool {
	return !svc.Headless && svc.Type != model.TypeExternalName
}

func wantsNodePorts(svc *model.Service) bool {
	return svc.Type == model.TypeNodePort || svc.Type == model.TypeLoadBalancer
}

func wantsHealthCheck(svc *model.Service) bool {
	return svc.Type == model.TypeLoadBalancer && svc.ExternalTrafficPolicy == model.PolicyLocal
}

// planFamilies returns the IP families svc gets ClusterIPs for, primary
// first, from spec.ipFamilies, spec.clusterIPs and spec.ipFamilyPolicy,
// the way the API server defaults them.
func (a *Assigner) planFamilies(svc *model.Service) ([]model.AddressType, error) {
	fail := func(field, value, format string, args ...any) error {
		return &AssignError{Service: svc.ServiceName, Field: field, Value: value, Err: fmt.Errorf(format, args...)}
	}
	if !wantsIPs(svc) {
		return nil, nil
	}
	var fams []model.AddressType
	explicit := map[model.AddressType]bool{}
	for i := 0; i < max(len(svc.IPFamilies), len(svc.ClusterIPs)); i++ {
		var f model.AddressType
		if i < len(svc.IPFamilies) {
			f = svc.IPFamilies[i]
			if f != model.IPv4 && f != model.IPv6 {
				return nil, fail(fmt.Sprintf("spec.ipFamilies[%d]", i), string(f), "want IPv4 or IPv6")
			}
		}
		if i < len(svc.ClusterIPs) {
			ip := svc.ClusterIPs[i]
			if !ip.IsValid() {
				return nil, fail(clusterIPField(i), "", "invalid address")
			}
			if f != "" && familyOf(ip) != f {
				return nil, fail(clusterIPField(i), ip.String(), "is not %s as spec.ipFamilies[%d] says", f, i)
			}
			f = familyOf(ip)
		}
		if slices.Contains(fams, f) {
			return nil, fail("spec.ipFamilies", string(f), "family given twice")
		}
		fams = append(fams, f)
		explicit[f] = true
	}
	other := func(f model.AddressType) model.AddressType {
		if f == model.IPv4 {
			return model.IPv6
		}
		return model.IPv4
	}
	switch svc.IPFamilyPolicy {
	case "", SingleStack:
		if len(fams) > 1 {
			return nil, fail("spec.ipFamilyPolicy", SingleStack, "but %d IP families requested", len(fams))
		}
		if len(fams) == 0 {
			fams = []model.AddressType{a.families[0]}
		}
	case PreferDualStack, RequireDualStack:
		if len(fams) == 0 {
			fams = []model.AddressType{a.families[0]}
		}
		if len(fams) == 1 && a.ips[other(fams[0])] != nil {
			fams = append(fams, other(fams[0]))
		}
		if svc.IPFamilyPolicy == RequireDualStack && len(fams) < 2 {
			return nil, fail("spec.ipFamilyPolicy", RequireDualStack, "only %s has a service CIDR", a.families[0])
		}
	default:
		return nil, fail("spec.ipFamilyPolicy", svc.IPFamilyPolicy, "want SingleStack, PreferDualStack or RequireDualStack")
	}
	for i, f := range fams {
		if a.ips[f] == nil {
			return nil, fail(fmt.Sprintf("spec.ipFamilies[%d]", i), string(f), "no service CIDR of this family is configured")
		}
	}
	return fams, nil
}

func clusterIPField(i int) string {
	if i == 0 {
		return "spec.clusterIP"
	}
	return fmt.Sprintf("spec.clusterIPs[%d]", i)
}

// validate refuses fixed values the Service type does not allow.
func validate(svc *model.Service) error {
	if !wantsIPs(svc) && len(svc.ClusterIPs) > 0 {
		return &AssignError{Service: svc.ServiceName, Field: "spec.clusterIPs", Value: svc.ClusterIPs[0].String(),
			Err: errors.New("must be empty for headless and ExternalName Services")}
	}
	if !wantsNodePorts(svc) {
		for i, p := range svc.Ports {
			if p.NodePort != 0 {
				return &AssignError{Service: svc.ServiceName, Field: fmt.Sprintf("spec.ports[%d].nodePort", i),
					Value: strconv.Itoa(int(p.NodePort)), Err: fmt.Errorf("may not be set when type is %q", svc.Type)}
			}
		}
	}
	if !wantsHealthCheck(svc) && svc.HealthCheckNodePort != 0 {
		return &AssignError{Service: svc.ServiceName, Field: "spec.healthCheckNodePort",
			Value: strconv.Itoa(int(svc.HealthCheckNodePort)),
			Err:   errors.New("may only be set when type is LoadBalancer and externalTrafficPolicy is Local")}
	}
	return nil
}

// Assign implements source.Assigner. The allocation map is updated (a
// compare-and-swap on the store) before the filled-in Service is
// returned. Values the Service held before and does not fix now are kept,
// so a restart or a re-read manifest gives the same VIP and NodePorts; an
// unchanged Service costs no store write. Errors are *AssignError naming
// the field and value, wrapping ErrAllocated ("already allocated to
// <ns/name>"), *ErrNotInRange or ErrFull; a store error is returned
// wrapped. With an etcd store Assign retries until ctx ends while etcd is
// unreachable, so pass a ctx with a deadline.
func (a *Assigner) Assign(ctx context.Context, svc model.Service) (model.Service, error) {
	out, errs := a.AssignAll(ctx, []*model.Service{&svc})
	return *out[0], errs[0]
}

// batchSize bounds the Services one store update carries (etcd refuses
// transactions of more than 128 operations by default). A store that
// implements batcher may allow more.
const batchSize = 100

// batcher is implemented by stores whose updates may carry more than
// batchSize Services.
type batcher interface{ maxBatch() int }

// maxBatch is the number of Services one update of s may carry.
func maxBatch(s Store) int {
	if b, ok := s.(batcher); ok {
		return b.maxBatch()
	}
	return batchSize
}

// AssignAll assigns many Services, several per store update (a cold start
// of thousands of manifests costs tens of fsyncs or etcd transactions, not
// thousands). out[i] and errs[i] belong to svcs[i]; out[i] is svcs[i]
// itself when errs[i] is not nil or when nothing was filled in (a Service
// naming its addresses, or re-assigned unchanged: a cold start's 50,000
// Services are not copied), else a new Service. The svcs are not modified.
// One Service's error never blocks the others; a store error fails every
// Service of its batch.
func (a *Assigner) AssignAll(ctx context.Context, svcs []*model.Service) ([]*model.Service, []error) {
	out := slices.Clone(svcs)
	errs := make([]error, len(svcs))
	fams := make([][]model.AddressType, len(svcs))
	todo := make([]int, 0, len(svcs))
	for i, svc := range svcs {
		if err := validate(svc); err != nil {
			errs[i] = err
			continue
		}
		f, err := a.planFamilies(svc)
		if err != nil {
			errs[i] = err
			continue
		}
		fams[i] = f
		todo = append(todo, i)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for len(todo) > 0 {
		batch := todo[:min(maxBatch(a.store), len(todo))]
		todo = todo[len(batch):]
		for _, i := range batch {
			a.assigned[svcs[i].ServiceName] = true
		}
		res := make([]*model.Service, len(batch))
		resErr := make([]error, len(batch))
		err := a.store.Update(ctx, func(m *Map) error {
			if !a.indexOK || a.indexRev != m.Revision() {
				a.index(m)
			}
			// From here the index holds uncommitted changes: valid again
			// only at the revision that commits them, or unchanged.
			a.indexOK = false
			for k, i := range batch {
				res[k], resErr[k] = a.assignOne(m, svcs[i], fams[i])
			}
			if !m.dirty() {
				a.indexOK, a.indexRev = true, m.Revision()
			}
			m.onCommit = func(rev int64) { a.indexOK, a.indexRev = true, rev }
			return nil
		})
		for k, i := range batch {
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("allocator: Service %s: %w", svcs[i].ServiceName, err)
			case resErr[k] != nil:
				errs[i] = resErr[k]
			default:
				out[i] = res[k]
			}
		}
	}
	return out, errs
}

// index marks every value of every record in the ranges and counts the
// holders of each value, so assignOne can step a Service out and back in.
func (a *Assigner) index(m *Map) {
	for _, r := range a.ips {
		r.Reset()
	}
	a.ports.Reset()
	clear(a.ipHolders)
	clear(a.portHolders)
	m.Range(func(_ model.ServiceName, r Record) bool {
		a.hold(r)
		return true
	})
}

// hold marks r's values taken; unhold frees those no other record holds.
func (a *Assigner) hold(r Record) {
	for _, ip := range r.ClusterIPs {
		a.ipHolders[ip]++
		if ipr := a.ips[familyOf(ip)]; ipr != nil {
			_ = ipr.Allocate(ip) // doubles and strays are the repair loop's to report
		}
	}
	for _, p := range r.Ports() {
		a.portHolders[p]++
		_ = a.ports.Allocate(p)
	}
}

func (a *Assigner) unhold(r Record) {
	for _, ip := range r.ClusterIPs {
		if a.ipHolders[ip]--; a.ipHolders[ip] <= 0 {
			delete(a.ipHolders, ip)
			if ipr := a.ips[familyOf(ip)]; ipr != nil {
				ipr.Release(ip)
			}
		}
	}
	for _, p := range r.Ports() {
		if a.portHolders[p]--; a.portHolders[p] <= 0 {
			delete(a.portHolders, p)
			a.ports.Release(p)
		}
	}
}

// assignOne assigns svc on an indexed map and records the result in m;
// on error m and the index are left as they were.
func (a *Assigner) assignOne(m *Map, svc *model.Service, fams []model.AddressType) (*model.Service, error) {
	prev, _ := m.Get(svc.ServiceName)
	a.unhold(prev)
	a.markedIPs, a.markedPorts = a.markedIPs[:0], a.markedPorts[:0]
	out, rec, err := a.assignLocked(m, svc, fams, prev)
	// Take back every mark assignLocked made (each was a free value), then
	// hold the record that stands, counting its holders.
	for _, ip := range a.markedIPs {
		a.ips[familyOf(ip)].Release(ip)
	}
	for _, p := range a.markedPorts {
		a.ports.Release(p)
	}
	if err != nil {
		a.hold(prev)
		return svc, err
	}
	a.hold(rec)
	m.Set(svc.ServiceName, rec)
	return out, nil
}

// Release implements source.Assigner: it deletes svc's record, freeing its
// IPs and ports. Releasing an unknown Service is not an error.
func (a *Assigner) Release(ctx context.Context, svc model.ServiceName) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.assigned[svc] = true
	delete(a.leaks, svc)
	a.indexOK = false
	if err := a.store.Update(ctx, func(m *Map) error {
		m.Delete(svc)
		return nil
	}); err != nil {
		return fmt.Errorf("allocator: release Service %s: %w", svc, err)
	}
	return nil
}

// Assignment is one Service's allocated values, for listings.
type Assignment struct {
	Service model.ServiceName
	Record
}

// List returns every Service in the allocation map with its ClusterIPs,
// NodePorts and health check port, sorted by namespace and name.
func (a *Assigner) List(ctx context.Context) ([]Assignment, error) {
	m, err := a.store.Snapshot(ctx)
	if err != nil {
		return nil, fmt.Errorf("allocator: list: %w", err)
	}
	var out []Assignment
	for _, n := range m.Names() {
		r, _ := m.Get(n)
		out = append(out, Assignment{Service: n, Record: r.clone()})
	}
	return out, nil
}
