package model

import "slices"

// Builder builds States like Build, but remembers what it built and
// reuses the ServicePorts (and Problems) of every Service whose inputs did
// not change since its previous Build: the Service itself, its
// EndpointSlices (in name order), and this node's name and zone. A change
// to one Service then costs a lookup and a comparison for each other
// Service instead of rebuilding it.
//
// The States it returns are deep-equal to Build's for the same Snapshot
// and options, whatever came before. Reused ServicePorts are the same
// pointers as in the previous State and may share backing arrays with
// earlier Snapshots (whose contents, by the Source contract, never change);
// treat every State as read-only.
//
// Inputs are compared by content, with a fast path for slices that share
// their backing array with the previous Snapshot (as a source that keeps
// converted objects between snapshots produces). A Snapshot with a Patch
// against the Snapshot of the previous Build costs less again: only the
// Services it names are looked at (see patch). The zero Builder is ready
// to use. A Builder is not safe for concurrent use.
type Builder struct {
	b        builder
	cache    map[ServiceName]*builtService
	gen      uint64
	nodeName string
	zone     string
	opts     BuildOptions
	// claimCopies maps a built port to the copy resolveClusterIPClaims
	// made of it in the last Build.
	claimCopies map[*ServicePort]*ServicePort

	// What a Patch starts from: the Gen of the last Build's Snapshot (0:
	// none usable), its ports sorted by key before claims were resolved,
	// the Services with Problems in name order, and whether it had
	// duplicate Services (then no Patch applies).
	built      uint64
	keyed      []*ServicePort
	problemOf  []ServiceName
	duplicates bool
	// uses is the last State's Uses (counted over keyed).
	uses    PortUses
	patched int // Builds that took the patch path (tests look)
}

// builtService is what one Build made of one Service, with the inputs it
// was made from.
type builtService struct {
	gen      uint64           // the Build that last used it
	svc      *Service         // the Snapshot's, read-only
	slices   []*EndpointSlice // in name order (the Snapshot's, read-only)
	ports    []*ServicePort
	problems []Problem
}

// Build returns Build(snap, opts), reusing unchanged Services' results of
// the previous call.
func (c *Builder) Build(snap *Snapshot, opts BuildOptions) *State {
	return c.b.build(snap, opts, c)
}

// begin starts a Build for this node name, zone and options; a change of
// any invalidates every remembered Service (Local and topology depend on
// the first two, derived hints and externalIP refusals on the options).
// It reports whether the remembered Services are still valid.
// services is the number of Services the Build has, to size a new cache.
func (c *Builder) begin(nodeName, zone string, opts BuildOptions, services int) bool {
	valid := true
	if c.cache == nil || nodeName != c.nodeName || zone != c.zone ||
		opts.DeriveHints != c.opts.DeriveHints || !slices.Equal(opts.Balances, c.opts.Balances) ||
		opts.OutlierEjection != c.opts.OutlierEjection || opts.QuietFlows != c.opts.QuietFlows ||
		(opts.Balances == nil) != (c.opts.Balances == nil) ||
		!slices.Equal(opts.ServiceCIDRs, c.opts.ServiceCIDRs) || !slices.Equal(opts.ExternalIPCIDRs, c.opts.ExternalIPCIDRs) {
		c.cache = make(map[ServiceName]*builtService, services)
		c.nodeName, c.zone = nodeName, zone
		c.opts = opts
		c.built, c.keyed = 0, nil
		valid = false
	}
	c.gen++
	return valid
}

// patchable reports whether snap can be built by patching the last
// Build's result.
func (c *Builder) patchable(snap *Snapshot) bool {
	return snap.Patch != nil && c.built != 0 && snap.Patch.Base == c.built && !c.duplicates
}

// remember records the finished full Build of snap, whose ports sorted by
// key (before claims) are ports, for the next Build's patch. ports is kept,
// not copied: it is the new State's Ports, which never change (see
// patch). The cache holds exactly snap's Services then.
func (c *Builder) remember(snap *Snapshot, ports []*ServicePort, duplicates bool) {
	c.built, c.duplicates = snap.Gen, duplicates
	c.keyed = ports[:len(ports):len(ports)]
	c.problemOf = c.problemOf[:0]
	for _, svc := range snap.Services {
		if e := c.cache[svc.ServiceName]; e != nil && len(e.problems) > 0 {
			c.problemOf = append(c.problemOf, svc.ServiceName)
		}
	}
	slices.SortFunc(c.problemOf, compareServiceName)
	c.problemOf = slices.Compact(c.problemOf) // duplicate Services
}

// lookup returns the remembered result for svc when svc and its slices
// all[idx] equal the inputs it was built from, else nil.
func (c *Builder) lookup(svc *Service, all []*EndpointSlice, idx []int) *builtService {
	e := c.cache[svc.ServiceName]
	if e == nil || len(e.slices) != len(idx) || (e.svc != svc && !ServiceEqual(e.svc, svc)) {
		return nil
	}
	for k, i := range idx {
		if s := all[i]; e.slices[k] != s && !EndpointSliceEqual(e.slices[k], s) {
			return nil
		}
	}
	e.gen = c.gen
	return e
}

// store remembers what svc, with its slices (see slicesOf; kept, not
// copied), was built into.
func (c *Builder) store(svc *Service, sl []*EndpointSlice, ports []*ServicePort, problems []Problem) {
	c.cache[svc.ServiceName] = &builtService{gen: c.gen, svc: svc, slices: sl, ports: slices.Clone(ports), problems: slices.Clone(problems)}
}

// slicesOf returns all[idx], nil for none: a Service's slices as a cache
// entry keeps them.
func slicesOf(all []*EndpointSlice, idx []int) []*EndpointSlice {
	if len(idx) == 0 {
		return nil
	}
	out := make([]*EndpointSlice, len(idx))
	for k, i := range idx {
		out[k] = all[i]
	}
	return out
}

// end forgets the Services the finished Build did not see.
func (c *Builder) end() {
	for n, e := range c.cache {
		if e.gen != c.gen {
			delete(c.cache, n)
		}
	}
}

// sameSlice reports whether a and b hold equal elements; slices that share
// their backing array are equal without a look at the elements.
func sameSlice[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true
	}
	return slices.Equal(a, b)
}

// ServiceEqual reports whether a and b are equal in every field (nil and
// empty slices are equal; slices sharing a backing array compare in O(1)).
func ServiceEqual(a, b *Service) bool {
	return a.ServiceName == b.ServiceName &&
		a.Type == b.Type &&
		sameSlice(a.ClusterIPs, b.ClusterIPs) &&
		a.Headless == b.Headless &&
		sameSlice(a.IPFamilies, b.IPFamilies) &&
		a.IPFamilyPolicy == b.IPFamilyPolicy &&
		sameSlice(a.ExternalIPs, b.ExternalIPs) &&
		sameSlice(a.LoadBalancerIPs, b.LoadBalancerIPs) &&
		sameSlice(a.LoadBalancerSourceRanges, b.LoadBalancerSourceRanges) &&
		a.AffinityTimeoutSeconds == b.AffinityTimeoutSeconds &&
		a.ExternalTrafficPolicy == b.ExternalTrafficPolicy &&
		a.InternalTrafficPolicy == b.InternalTrafficPolicy &&
		a.HealthCheckNodePort == b.HealthCheckNodePort &&
		a.TrafficDistribution == b.TrafficDistribution &&
		a.Balance == b.Balance &&
		a.OutlierEjection == b.OutlierEjection &&
		a.SlowStart == b.SlowStart &&
		a.DrainReset == b.DrainReset &&
		sameSlice(a.Ports, b.Ports)
}

// EndpointSliceEqual reports whether a and b are equal in every field,
// as ServiceEqual.
func EndpointSliceEqual(a, b *EndpointSlice) bool {
	if a.Name != b.Name || a.Service != b.Service || a.AddressType != b.AddressType ||
		!sameSlice(a.Ports, b.Ports) || len(a.Endpoints) != len(b.Endpoints) {
		return false
	}
	if len(a.Endpoints) == 0 || &a.Endpoints[0] == &b.Endpoints[0] {
		return true
	}
	for i := range a.Endpoints {
		if !sliceEndpointEqual(&a.Endpoints[i], &b.Endpoints[i]) {
			return false
		}
	}
	return true
}

// sliceEndpointEqual reports whether a and b are equal in every field.
func sliceEndpointEqual(a, b *SliceEndpoint) bool {
	return a.Address == b.Address &&
		a.Ready == b.Ready &&
		a.Serving == b.Serving &&
		a.Terminating == b.Terminating &&
		a.Loc == b.Loc &&
		a.Weight == b.Weight
}
