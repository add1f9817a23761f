// Package model holds vipproxy's source-independent view of Services and
// endpoints and the pure functions that turn a Snapshot of inputs into the
// State every dataplane programs.
//
// model uses the standard library only: no client-go, no clocks, no I/O.
// Sources (Kubernetes, manifests) convert API objects into Snapshot; Build
// validates, merges and selects endpoints; dataplanes consume State.
package model

import (
	"cmp"
	"encoding/binary"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unique"
)

// Protocol is a Service port protocol as Kubernetes spells it.
type Protocol string

// The protocols a Service port can use.
const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// TrafficPolicy is an internal or external traffic policy.
type TrafficPolicy string

// The traffic policies. The zero value is treated as Cluster.
const (
	PolicyCluster TrafficPolicy = "Cluster"
	PolicyLocal   TrafficPolicy = "Local"
)

// ServiceType is a Service's spec.type.
type ServiceType string

// The Service types vipproxy knows.
const (
	TypeClusterIP    ServiceType = "ClusterIP"
	TypeNodePort     ServiceType = "NodePort"
	TypeLoadBalancer ServiceType = "LoadBalancer"
	TypeExternalName ServiceType = "ExternalName"
)

// Traffic distribution values (spec.trafficDistribution).
const (
	DistributionPreferClose     = "PreferClose"
	DistributionPreferSameZone  = "PreferSameZone"
	DistributionPreferSameNode  = "PreferSameNode"
	DefaultAffinityTimeoutSecs  = 10800
	MaxAffinityTimeoutSecs      = 86400
	LabelServiceProxyName       = "service.kubernetes.io/service-proxy-name"
	LabelHeadless               = "service.kubernetes.io/headless"
	LabelTopologyZone           = "topology.kubernetes.io/zone"
	TaintToBeDeletedByAutoscale = "ToBeDeletedByClusterAutoscaler"
)

// ServiceName names a Service.
type ServiceName struct {
	Namespace string
	Name      string
}

func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// ServicePortName names one port of one Service. Port is the port's name
// ("" for a Service's single unnamed port).
type ServicePortName struct {
	ServiceName
	Port     string
	Protocol Protocol
}

// String returns "namespace/name:port/PROTO" (":port" omitted when unnamed).
func (n ServicePortName) String() string {
	s := n.ServiceName.String()
	if n.Port != "" {
		s += ":" + n.Port
	}
	return s + "/" + string(n.Protocol)
}

// Compare orders port names as strings.Compare(n.String(), m.String())
// does, without building the strings: a State's ports are in this order,
// and a key string kept per port was 1 MB at 10,000 Services.
func (n ServicePortName) Compare(m ServicePortName) int {
	if n.Namespace == m.Namespace && !strings.HasPrefix(n.Name, m.Name) && !strings.HasPrefix(m.Name, n.Name) {
		return strings.Compare(n.Name, m.Name) // they differ before either ends
	}
	var a, b [7]string
	return compareConcat(n.parts(&a), m.parts(&b))
}

// parts returns the pieces of n.String() in p.
func (n *ServicePortName) parts(p *[7]string) []string {
	p[0], p[1], p[2] = n.Namespace, "/", n.Name
	k := 3
	if n.Port != "" {
		p[3], p[4], k = ":", n.Port, 5
	}
	p[k], p[k+1] = "/", string(n.Protocol)
	return p[:k+2]
}

// compareConcat is strings.Compare(strings.Join(a, ""), strings.Join(b, "")).
func compareConcat(a, b []string) int {
	var x, y string // what is left of the current pieces
	for {
		for x == "" && len(a) > 0 {
			x, a = a[0], a[1:]
		}
		for y == "" && len(b) > 0 {
			y, b = b[0], b[1:]
		}
		if x == "" || y == "" {
			return cmp.Compare(len(x), len(y)) // one ended: it is the smaller, or both
		}
		k := min(len(x), len(y))
		if c := strings.Compare(x[:k], y[:k]); c != 0 {
			return c
		}
		x, y = x[k:], y[k:]
	}
}

// Service is a v1 Service as a source hands it over: already parsed, with
// addresses in canonical form. Sources drop Services labelled
// LabelServiceProxyName or LabelHeadless before they get here.
type Service struct {
	ServiceName
	Type ServiceType
	// ClusterIPs holds spec.clusterIPs (primary first). Empty for headless
	// ("None") and ExternalName Services.
	ClusterIPs []netip.Addr
	// IPFamilies is spec.ipFamilies (requested families, primary first);
	// IPFamilyPolicy is spec.ipFamilyPolicy ("SingleStack" when empty,
	// "PreferDualStack", "RequireDualStack"). Allocators use both when
	// ClusterIPs is empty; dataplanes read ClusterIPs only.
	IPFamilies               []AddressType
	IPFamilyPolicy           string
	ExternalIPs              []netip.Addr
	LoadBalancerIPs          []netip.Addr // status.loadBalancer.ingress[].ip with ipMode VIP (or unset)
	LoadBalancerSourceRanges []netip.Prefix
	// AffinityTimeoutSeconds > 0 means sessionAffinity ClientIP with that timeout.
	AffinityTimeoutSeconds int
	ExternalTrafficPolicy  TrafficPolicy
	InternalTrafficPolicy  TrafficPolicy
	HealthCheckNodePort    uint16
	// Headless is spec.clusterIP "None". It sits here, beside the other
	// small field, so that a Service is 320 bytes (a size class) rather
	// than 328 (which takes 352), at one per Service kept.
	Headless            bool
	TrafficDistribution string
	// Balance is the vipproxy.io/lb-algorithm annotation: how a new
	// connection picks among the eligible endpoints ("" is the mode's
	// default, uniform random in the netfilter modes).
	Balance Balance
	// OutlierEjection is the vipproxy.io/outlier-ejection annotation: "on",
	// "off" or "" (the node's default, BuildOptions.OutlierEjection).
	OutlierEjection string
	// SlowStart is the vipproxy.io/slow-start annotation: a new endpoint's
	// share of new connections ramps up over this time (0: at once).
	SlowStart time.Duration
	// DrainReset is the vipproxy.io/drain annotation's reset-after: TCP
	// flows to an endpoint that left the Service are cut this long after
	// it left (0: they are kept, as kube-proxy does).
	DrainReset time.Duration
	Ports      []ServicePortSpec
}

// Balance is a load-balancing algorithm chosen per Service by the
// AnnotationBalance annotation.
type Balance string

// The balancing algorithms. BalanceDefault ("") is what the mode does
// without the annotation: uniform (or weighted) random in the nftables,
// iptables and IPVS-fallback modes, the configured scheduler in the
// userspace and IPVS modes.
const (
	BalanceDefault Balance = ""
	// BalanceRandom picks an endpoint at random, in proportion to its weight.
	BalanceRandom Balance = "random"
	// BalanceRoundRobin hands new connections to the endpoints in turn,
	// each as many times in a round as its weight.
	BalanceRoundRobin Balance = "round-robin"
	// BalanceConsistentHash picks by a hash of the client's address over a
	// Maglev table (see package balance): a client keeps its endpoint while
	// it exists, and removing one of N endpoints moves about 1/N of clients.
	BalanceConsistentHash Balance = "consistent-hash"
)

// Balances lists the algorithms AnnotationBalance accepts.
var Balances = []Balance{BalanceRandom, BalanceRoundRobin, BalanceConsistentHash}

// Annotations vipproxy reads.
const (
	// AnnotationBalance on a Service selects its Balance.
	AnnotationBalance = "vipproxy.io/lb-algorithm"
	// AnnotationWeight on an EndpointSlice is the weight (1..MaxWeight) of
	// every endpoint in it; endpoints of slices without it weigh 1.
	AnnotationWeight = "vipproxy.io/weight"
	// MaxWeight is the largest endpoint weight.
	MaxWeight = 100
	// AnnotationOutlierEjection on a Service ("on" or "off") turns passive
	// outlier ejection of its endpoints on or off, whatever the default.
	AnnotationOutlierEjection = "vipproxy.io/outlier-ejection"
	// AnnotationSlowStart on a Service (a duration, at most MaxSlowStart)
	// ramps new endpoints' weight up over that time.
	AnnotationSlowStart = "vipproxy.io/slow-start"
	// MaxSlowStart bounds AnnotationSlowStart.
	MaxSlowStart = time.Hour
	// AnnotationDrain on a Service: "keep" (the default: established TCP
	// flows to a removed endpoint go on) or "reset-after=DURATION".
	AnnotationDrain = "vipproxy.io/drain"
)

// ServicePortSpec is one entry of spec.ports.
type ServicePortSpec struct {
	Name     string
	Protocol Protocol
	Port     uint16
	NodePort uint16
}

// AddressType is an EndpointSlice's address type.
type AddressType string

// Address types vipproxy proxies (FQDN slices are ignored by sources).
const (
	IPv4 AddressType = "IPv4"
	IPv6 AddressType = "IPv6"
)

// EndpointSlice is a discovery/v1 EndpointSlice as a source hands it over.
type EndpointSlice struct {
	Name        string
	Service     ServiceName // from the kubernetes.io/service-name label
	AddressType AddressType
	Ports       []EndpointPort
	Endpoints   []SliceEndpoint
}

// EndpointPort is one entry of an EndpointSlice's ports.
type EndpointPort struct {
	Name     string
	Protocol Protocol
	Port     uint16
}

// SliceEndpoint is one entry of an EndpointSlice's endpoints. Conditions
// are already defaulted as the API documents (nil ready = true, nil serving
// = ready, nil terminating = false).
//
// An endpoint keeps one address: the first valid one of its slice's
// family, the one kube-proxy uses (addresses[0]); converters check the
// others and drop them. The zero Address is none. Fields are ordered for
// size (40 bytes): a node holds 100,000s of these.
type SliceEndpoint struct {
	Address netip.Addr
	// Loc is the endpoint's nodeName, zone and topology hints (see At and
	// Loc.WithHints).
	Loc         Loc
	Ready       bool
	Serving     bool
	Terminating bool
	// Weight is the endpoint's weight (its slice's AnnotationWeight),
	// 1..MaxWeight; 0 means 1.
	Weight uint8
}

// NodeName returns e's nodeName ("" when unset).
func (e *SliceEndpoint) NodeName() string { return e.Loc.Locality().NodeName }

// Zone returns e's zone ("" when unset).
func (e *SliceEndpoint) Zone() string { return e.Loc.Locality().Zone }

// ZoneHints returns the zone names of e's hints.
func (e *SliceEndpoint) ZoneHints() []string { return e.Loc.ZoneHints() }

// NodeHints returns the node names of e's hints.
func (e *SliceEndpoint) NodeHints() []string { return e.Loc.NodeHints() }

// Locality is where an endpoint runs: its node and zone.
type Locality struct {
	NodeName string
	Zone     string
}

// Loc is a canonical Locality with an endpoint's topology hints (its
// EndpointSlice's hints.forZones and hints.forNodes). The 100,000s of
// endpoints of a cluster run on a few nodes and carry a few distinct
// hints, so they share a few values: a Loc is 8 bytes (a unique.Handle)
// instead of two string headers and a pointer to the hints (40), and
// equal values have equal Locs. The zero Loc is the empty Locality
// without hints.
type Loc struct{ h unique.Handle[locKey] }

// locKey is a Loc's value. The hint names are joined (see joinNames) so
// that the value is comparable.
type locKey struct {
	Locality
	zones, nodes string
}

// At returns the Loc of node and zone, without hints.
func At(node, zone string) Loc { return locOf(locKey{Locality: Locality{NodeName: node, Zone: zone}}) }

func locOf(k locKey) Loc {
	if k == (locKey{}) {
		return Loc{}
	}
	return Loc{unique.Make(k)}
}

func (l Loc) key() locKey {
	if l == (Loc{}) {
		return locKey{}
	}
	return l.h.Value()
}

// Locality returns l's node and zone.
func (l Loc) Locality() Locality { return l.key().Locality }

// WithHints returns l with zones and nodes as its hints (none when both
// are empty), replacing any it had.
func (l Loc) WithHints(zones, nodes []string) Loc {
	k := l.key()
	k.zones, k.nodes = joinNames(zones), joinNames(nodes)
	return locOf(k)
}

// withHint returns l with hints naming zone and node alone ("" for no
// hint of the kind): WithHints without building slices.
func (l Loc) withHint(zone, node string) Loc {
	k := l.key()
	k.zones, k.nodes = "", ""
	if zone != "" {
		k.zones = joinNames([]string{zone})
	}
	if node != "" {
		k.nodes = joinNames([]string{node})
	}
	return locOf(k)
}

// Parts returns l's node, zone and hints in an opaque form that LocOf
// takes back, for codecs that keep Locs within one build of vipproxy.
func (l Loc) Parts() (node, zone, zoneHints, nodeHints string) {
	k := l.key()
	return k.NodeName, k.Zone, k.zones, k.nodes
}

// LocOf is the Loc whose Parts are node, zone, zoneHints and nodeHints.
func LocOf(node, zone, zoneHints, nodeHints string) Loc {
	return locOf(locKey{Locality: Locality{NodeName: node, Zone: zone}, zones: zoneHints, nodes: nodeHints})
}

// ZoneHints returns the zone names of l's hints (nil for none), in a new
// slice.
func (l Loc) ZoneHints() []string { return splitNames(l.key().zones) }

// NodeHints returns the node names of l's hints (nil for none), in a new
// slice.
func (l Loc) NodeHints() []string { return splitNames(l.key().nodes) }

// hasZoneHints and hasNodeHints report whether l has hints of the kind;
// zoneHinted and nodeHinted whether one of them names name. None of them
// allocates.
func (l Loc) hasZoneHints() bool          { return l.key().zones != "" }
func (l Loc) hasNodeHints() bool          { return l.key().nodes != "" }
func (l Loc) zoneHinted(name string) bool { return hasName(l.key().zones, name) }
func (l Loc) nodeHinted(name string) bool { return hasName(l.key().nodes, name) }

// The hint names of a locKey are joined, each after its length as a
// uvarint, so that any string (a name from a manifest may hold any byte)
// reads back as it was.

func joinNames(names []string) string {
	var b []byte
	for _, n := range names {
		b = binary.AppendUvarint(b, uint64(len(n)))
		b = append(b, n...)
	}
	return string(b)
}

// nextName splits the first name off joined.
func nextName(joined string) (name, rest string) {
	n, w := binary.Uvarint([]byte(joined[:min(len(joined), binary.MaxVarintLen64)]))
	return joined[w : w+int(n)], joined[w+int(n):]
}

func splitNames(joined string) []string {
	var out []string
	for joined != "" {
		var n string
		n, joined = nextName(joined)
		out = append(out, n)
	}
	return out
}

// hasName reports whether name is one of the names joined.
func hasName(joined, name string) bool {
	for joined != "" {
		var n string
		if n, joined = nextName(joined); n == name {
			return true
		}
	}
	return false
}

// Equal reports whether l and o are the same locality with the same hints
// (for go-cmp, which cannot look into a unique.Handle).
func (l Loc) Equal(o Loc) bool { return l == o }

// String returns "node/zone", with the hints after it when there are some
// (what fmt prints for a Loc, e.g. in a test's %+v of an Endpoint).
func (l Loc) String() string {
	k := l.key()
	s := k.NodeName + "/" + k.Zone
	if k.zones != "" || k.nodes != "" {
		s += " hints zones=" + strings.Join(splitNames(k.zones), ",") + " nodes=" + strings.Join(splitNames(k.nodes), ",")
	}
	return s
}

// Node is the node vipproxy runs on, as far as it matters for proxying.
type Node struct {
	Name      string
	Labels    map[string]string
	Addresses []netip.Addr
	// PodCIDRs is spec.podCIDRs (else spec.podCIDR): this node's pod
	// ranges, for detectLocalMode NodeCIDR.
	PodCIDRs []netip.Prefix
	// Deleting is true when the Node has a deletionTimestamp.
	Deleting bool
	// ToBeDeleted is true when the Node has the ToBeDeletedByClusterAutoscaler taint.
	ToBeDeleted bool
}

// NodeEqual reports whether a and b are equal in every field (nil only
// equals nil; nil and empty slices and maps are equal).
func NodeEqual(a, b *Node) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Name == b.Name && maps.Equal(a.Labels, b.Labels) && slices.Equal(a.Addresses, b.Addresses) &&
		slices.Equal(a.PodCIDRs, b.PodCIDRs) && a.Deleting == b.Deleting && a.ToBeDeleted == b.ToBeDeleted
}

// Zone returns the node's topology.kubernetes.io/zone label, or "".
func (n *Node) Zone() string {
	if n == nil {
		return ""
	}
	return n.Labels[LabelTopologyZone]
}

// Snapshot is a complete, consistent view of a source's inputs.
type Snapshot struct {
	// Services and Slices point at objects that sources share between
	// their Snapshots: they are read-only, and a Snapshot made from
	// another copies pointers, not objects.
	Services []*Service
	Slices   []*EndpointSlice
	// Node is this node, or nil when the source does not know it.
	Node *Node
	// Problems lists objects the source refused while converting them.
	Problems []Problem
	// ChangeTriggers are the trigger times of the EndpointSlice changes
	// since the previous Snapshot (annotation
	// endpoints.kubernetes.io/last-change-trigger-time, written by the
	// EndpointSlice controller): network programming latency is measured
	// from them, as kube-proxy measures it. Empty when the source has none
	// (standalone); latency is then measured from receipt.
	ChangeTriggers []ChangeTrigger
	// Gen numbers a source's Snapshots, from 1; 0 means not numbered.
	Gen uint64
	// Patch, when set, says how this Snapshot was made from an earlier
	// one of the same source, so that a Builder can look at the changed
	// Services only. nil: anything may have changed.
	Patch *Patch
}

// Patch describes a Snapshot made from Snapshot number Base by replacing
// objects in place. Its Services and Slices have Base's lengths and the
// same Service names (and slice names and Services) at every index; only
// the Services at the indices in Services and the slices at the indices
// in Slices differ. Services are sorted by name, without duplicates.
// Node, Problems and ChangeTriggers are the Snapshot's own.
type Patch struct {
	Base     uint64
	Services []int
	Slices   []int
}

// ChangeTrigger is one EndpointSlice change's trigger time and the slice's
// address family.
type ChangeTrigger struct {
	Family AddressType
	Time   time.Time
}

// Problem describes one refused object or field. Object names the object
// ("Service default/web", "file svc.yaml document 2"), Field the JSON path
// of the bad field, Value the bad value. File, when set, is the manifest
// file the problem was found in: logs group by it, so that one broken
// file cannot flood them (Error does not print it; Object names the file).
type Problem struct {
	Object string
	Field  string
	Value  string
	Reason string
	File   string
}

func (p Problem) Error() string {
	s := p.Object
	if p.Field != "" {
		s += ": " + p.Field
	}
	if p.Value != "" {
		s += " " + strconv.Quote(p.Value)
	}
	return s + ": " + p.Reason
}

// Endpoint is one backend of a ServicePort. Fields are ordered for size
// (40 bytes): a node holds 100,000s of these.
type Endpoint struct {
	IP netip.Addr
	// Loc is the endpoint's nodeName, zone and topology hints (see At and
	// Loc.WithHints).
	Loc         Loc
	Port        uint16
	Ready       bool
	Serving     bool
	Terminating bool
	// Local is true when the endpoint runs on this node.
	Local bool
	// Weight is the endpoint's relative share of new connections,
	// 1..MaxWeight; 0 means 1. See W.
	Weight uint8
}

// NodeName returns e's nodeName ("" when unset).
func (e *Endpoint) NodeName() string { return e.Loc.Locality().NodeName }

// Zone returns e's zone ("" when unset).
func (e *Endpoint) Zone() string { return e.Loc.Locality().Zone }

// W returns e's weight, at least 1.
func (e *Endpoint) W() int {
	if e.Weight == 0 {
		return 1
	}
	return int(e.Weight)
}

// ZoneHints returns the zone names of e's hints.
func (e *Endpoint) ZoneHints() []string { return e.Loc.ZoneHints() }

// NodeHints returns the node names of e's hints.
func (e *Endpoint) NodeHints() []string { return e.Loc.NodeHints() }

// String returns "ip:port" ("[ip]:port" for IPv6).
func (e Endpoint) String() string {
	return netip.AddrPortFrom(e.IP, e.Port).String()
}

// ServicePort is one port of one Service with everything a dataplane
// needs to program it.
type ServicePort struct {
	Name                     ServicePortName
	Type                     ServiceType
	ClusterIPs               []netip.Addr
	Port                     uint16
	Protocol                 Protocol
	NodePort                 uint16
	ExternalIPs              []netip.Addr
	LoadBalancerIPs          []netip.Addr
	LoadBalancerSourceRanges []netip.Prefix
	AffinityTimeoutSeconds   int // > 0: ClientIP affinity
	InternalTrafficPolicy    TrafficPolicy
	ExternalTrafficPolicy    TrafficPolicy
	HealthCheckNodePort      uint16
	TrafficDistribution      string
	// Balance is the Service's balancing algorithm (BalanceDefault when
	// unset or when the dataplane cannot do the one asked for: see
	// BuildOptions.Balances).
	Balance Balance
	// OutlierEjection: endpoints whose new connections keep failing leave
	// selection for a while (the Service's annotation, else the default).
	OutlierEjection bool
	// QuietFlows: the port's flows need not report conntrack events
	// (vipproxy reads the events of TCP ports with ejection only; see
	// BuildOptions.QuietFlows). A dataplane that can set a flow's event
	// mask sets it empty, so that the kernel spends nothing on them.
	QuietFlows bool
	// SampledFlows: vipproxy reads the port's flows for outlier ejection
	// only (FlowsRead, with BuildOptions.QuietFlows). A dataplane that can
	// set a flow's event mask has every flow report its end (a refused SYN
	// ends at once) and a sample of them their start and answer too (an
	// unanswered SYN is seen through those), so that a healthy flow costs
	// the kernel nothing in its packets' path. The ejector clears it on a
	// copy of the port while one of its endpoints is suspect (a failure
	// within the ejection window), so that every success between failures
	// is seen.
	SampledFlows bool
	// SlowStart: endpoints that appear ramp up to their weight over this
	// time (the Service's annotation; 0: off).
	SlowStart time.Duration
	// DrainReset: TCP flows to an endpoint that left are cut this long
	// after it left (0: kept).
	DrainReset time.Duration

	// Endpoints holds every endpoint of the port, merged across slices,
	// de-duplicated and sorted by address then port.
	Endpoints []Endpoint
	// ClusterEndpoints are the endpoints for Cluster-policy traffic, nil
	// when no traffic of this port uses the Cluster policy.
	ClusterEndpoints []Endpoint
	// LocalEndpoints are the endpoints for Local-policy traffic, nil when
	// no traffic of this port uses the Local policy.
	LocalEndpoints []Endpoint
}

// ExternallyAccessible reports whether the port can be reached from outside
// the cluster (NodePort, externalIPs or load-balancer IPs).
func (p *ServicePort) ExternallyAccessible() bool {
	return p.NodePort != 0 || len(p.ExternalIPs) > 0 || len(p.LoadBalancerIPs) > 0
}

// ExternalPolicyLocal reports whether external traffic uses the Local policy.
func (p *ServicePort) ExternalPolicyLocal() bool {
	return p.ExternallyAccessible() && p.ExternalTrafficPolicy == PolicyLocal
}

// FlowsRead reports whether vipproxy reads the conntrack events of the
// port's flows: outlier ejection watches TCP connections only.
func (p *ServicePort) FlowsRead() bool { return p.OutlierEjection && p.Protocol == TCP }

// InternalPolicyLocal reports whether internal traffic uses the Local policy.
func (p *ServicePort) InternalPolicyLocal() bool {
	return p.InternalTrafficPolicy == PolicyLocal
}

// InternalEndpoints returns the endpoints for traffic to ClusterIPs.
func (p *ServicePort) InternalEndpoints() []Endpoint {
	if p.InternalPolicyLocal() {
		return p.LocalEndpoints
	}
	return p.ClusterEndpoints
}

// ExternalEndpoints returns the endpoints for traffic to NodePorts,
// externalIPs and load-balancer IPs.
func (p *ServicePort) ExternalEndpoints() []Endpoint {
	if p.ExternalPolicyLocal() {
		return p.LocalEndpoints
	}
	return p.ClusterEndpoints
}

// ReachableEndpoints returns the union of ClusterEndpoints and
// LocalEndpoints: every endpoint this node may send traffic to.
func (p *ServicePort) ReachableEndpoints() []Endpoint {
	if p.LocalEndpoints == nil {
		return p.ClusterEndpoints
	}
	if p.ClusterEndpoints == nil {
		return p.LocalEndpoints
	}
	seen := make(map[netip.AddrPort]bool, len(p.ClusterEndpoints))
	out := append([]Endpoint(nil), p.ClusterEndpoints...)
	for _, e := range out {
		seen[netip.AddrPortFrom(e.IP, e.Port)] = true
	}
	for _, e := range p.LocalEndpoints {
		if !seen[netip.AddrPortFrom(e.IP, e.Port)] {
			out = append(out, e)
		}
	}
	return out
}

// State is the desired state handed to a dataplane's Sync.
type State struct {
	// NodeName is this node's name.
	NodeName string
	// Node is this node, or nil when no source knows it.
	Node *Node
	// Ports holds every proxied ServicePort, sorted by Name.String().
	Ports []*ServicePort
	// Problems lists everything Build or the source refused.
	Problems []Problem
	// Uses counts the ports (as built) that use options most ports
	// leave off; nil when the State was not made by Build or a Builder:
	// then look at every port.
	Uses *PortUses
}

// PortUses counts the ports of a State that use options most ports leave
// off, so that a consumer with nothing to do for them can skip its pass
// over every port (at 50,000 ports each such pass took a millisecond or
// more of every change).
type PortUses struct {
	SlowStart       int // ports with SlowStart > 0
	DrainReset      int // ports with DrainReset > 0
	OutlierEjection int // ports with OutlierEjection
	SampledFlows    int // ports with SampledFlows
	// Claims is the number of ports with an externalIP or load-balancer
	// IP (addresses another port's ClusterIP may claim).
	Claims int
}

// UsesOf counts the rare options of ports, as Build does for its State.
func UsesOf(ports []*ServicePort) *PortUses {
	u := &PortUses{}
	for _, sp := range ports {
		u.count(sp, 1)
	}
	return u
}

// count adds d (1 or -1) to the counts sp is in.
func (u *PortUses) count(sp *ServicePort, d int) {
	if sp.SlowStart > 0 {
		u.SlowStart += d
	}
	if sp.DrainReset > 0 {
		u.DrainReset += d
	}
	if sp.OutlierEjection {
		u.OutlierEjection += d
	}
	if sp.SampledFlows {
		u.SampledFlows += d
	}
	if len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0 {
		u.Claims += d
	}
}

// Equal reports whether p and o hold the same values in every field. A
// dataplane that cached what it built from p can reuse it for o when
// they are Equal (the model passes an unchanged port on as the same
// pointer; Equal catches one rebuilt with the same content). nil and empty
// Endpoints differ for ClusterEndpoints and LocalEndpoints (nil: no set of
// that policy).
func (p *ServicePort) Equal(o *ServicePort) bool {
	return p.Name == o.Name && p.Type == o.Type && p.Port == o.Port && p.Protocol == o.Protocol &&
		p.NodePort == o.NodePort && p.AffinityTimeoutSeconds == o.AffinityTimeoutSeconds &&
		p.InternalTrafficPolicy == o.InternalTrafficPolicy && p.ExternalTrafficPolicy == o.ExternalTrafficPolicy &&
		p.HealthCheckNodePort == o.HealthCheckNodePort && p.TrafficDistribution == o.TrafficDistribution &&
		p.Balance == o.Balance && p.OutlierEjection == o.OutlierEjection && p.QuietFlows == o.QuietFlows && p.SampledFlows == o.SampledFlows && p.SlowStart == o.SlowStart && p.DrainReset == o.DrainReset && slices.Equal(p.ClusterIPs, o.ClusterIPs) && slices.Equal(p.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(p.LoadBalancerIPs, o.LoadBalancerIPs) && slices.Equal(p.LoadBalancerSourceRanges, o.LoadBalancerSourceRanges) &&
		endpointsEqual(p.Endpoints, o.Endpoints) && endpointsEqual(p.ClusterEndpoints, o.ClusterEndpoints) &&
		endpointsEqual(p.LocalEndpoints, o.LocalEndpoints)
}

func endpointsEqual(a, b []Endpoint) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	for i := range a {
		if !a[i].Equal(&b[i]) {
			return false
		}
	}
	return true
}

// Equal reports whether e and o hold the same values in every field.
func (e *Endpoint) Equal(o *Endpoint) bool {
	return e.IP == o.IP && e.Port == o.Port && e.Ready == o.Ready && e.Serving == o.Serving &&
		e.Terminating == o.Terminating && e.Local == o.Local && e.Weight == o.Weight && e.Loc == o.Loc
}

// Ptrs returns pointers to the elements of vs (a convenience for building
// a Snapshot from values; the pointers share vs's backing array).
func Ptrs[T any](vs []T) []*T {
	if vs == nil {
		return nil
	}
	out := make([]*T, len(vs))
	for i := range vs {
		out[i] = &vs[i]
	}
	return out
}
