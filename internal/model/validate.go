package model

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
)

// FieldError is one broken invariant found by Validate. Field is the path
// in the Service's API spelling ("spec.clusterIPs[1]", "spec.ports.nodePort",
// "endpoints[3]"); Value is the bad value as text. Err, when set, is a
// sentinel (ErrLoopback, …) the failure wraps.
type FieldError struct {
	Field  string
	Value  string
	Reason string
	Err    error
}

func (e *FieldError) Error() string {
	s := e.Field
	if e.Value != "" {
		s += " " + strconv.Quote(e.Value)
	}
	return s + ": " + e.Reason
}

func (e *FieldError) Unwrap() error { return e.Err }

// FieldErrors returns the FieldErrors inside err (as returned by Validate),
// in order; nil when err is nil.
func FieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		if fe, ok := err.(*FieldError); ok {
			out = append(out, fe)
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

// Validate checks every invariant a dataplane relies on and returns nil or
// an errors.Join of *FieldError (use FieldErrors to list them):
//
//   - Name: namespace and name non-empty; Name.Protocol equals Protocol.
//   - Type: ClusterIP, NodePort or LoadBalancer ("" counts as ClusterIP);
//     ExternalName never becomes a ServicePort.
//   - Protocol TCP, UDP or SCTP; Port 1-65535.
//   - ClusterIPs: one or two, valid, canonical (no zone, not IPv4-mapped),
//     not unspecified or multicast, two only when of different families.
//     Loopback VIPs are allowed (the userspace mode serves a loopback
//     range).
//   - ExternalIPs and LoadBalancerIPs: same rules as ClusterIPs, no
//     duplicates, of a family some ClusterIP has.
//   - LoadBalancerSourceRanges: valid, canonical, host bits clear.
//   - NodePort: non-zero only for NodePort and LoadBalancer; required for
//     NodePort. HealthCheckNodePort: only for LoadBalancer with
//     externalTrafficPolicy Local, and different from NodePort.
//   - AffinityTimeoutSeconds 0..86400 (0 = no affinity).
//   - Traffic policies "", Cluster or Local; TrafficDistribution "",
//     PreferClose, PreferSameZone or PreferSameNode.
//   - Endpoints: each address passes CheckEndpointIP and is of a family
//     some ClusterIP has; port non-zero; sorted by address then port
//     without duplicates; ClusterEndpoints and LocalEndpoints only hold
//     members of Endpoints.
func (p *ServicePort) Validate() error {
	var errs []error
	add := func(field, value, reason string, sentinel error) {
		errs = append(errs, &FieldError{Field: field, Value: value, Reason: reason, Err: sentinel})
	}
	if p.Name.Namespace == "" {
		add("metadata.namespace", "", "must not be empty", nil)
	}
	if p.Name.Name == "" {
		add("metadata.name", "", "must not be empty", nil)
	}
	switch p.Protocol {
	case TCP, UDP, SCTP:
	default:
		add("spec.ports.protocol", string(p.Protocol), "must be TCP, UDP or SCTP", nil)
	}
	if p.Name.Protocol != p.Protocol {
		add("spec.ports.protocol", string(p.Name.Protocol), "port name's protocol differs from the port's "+string(p.Protocol), nil)
	}
	if p.Port == 0 {
		add("spec.ports.port", "0", "must be 1-65535", nil)
	}
	switch p.Type {
	case "", TypeClusterIP, TypeNodePort, TypeLoadBalancer:
	default:
		add("spec.type", string(p.Type), "must be ClusterIP, NodePort or LoadBalancer", nil)
	}

	var fam4, fam6 bool
	switch len(p.ClusterIPs) {
	case 0:
		add("spec.clusterIPs", "", "a proxied Service needs a ClusterIP", nil)
	case 1, 2:
	default:
		add("spec.clusterIPs", fmt.Sprint(p.ClusterIPs), "at most two (one per family)", nil)
	}
	for i, a := range p.ClusterIPs {
		if r := vipProblem(a); r != "" {
			add(indexed("spec.clusterIPs", i), a.String(), r, nil)
			continue
		}
		if (a.Is4() && fam4) || (a.Is6() && fam6) {
			add(indexed("spec.clusterIPs", i), a.String(), "two ClusterIPs of one family", nil)
		}
		fam4 = fam4 || a.Is4()
		fam6 = fam6 || a.Is6()
	}
	familyOK := func(a netip.Addr) bool { return (a.Is4() && fam4) || (a.Is6() && fam6) }
	checkVIPs := func(field string, list []netip.Addr) {
		for i, a := range list {
			switch r := vipProblem(a); {
			case r != "":
				add(indexed(field, i), a.String(), r, nil)
			case slices.Contains(list[:i], a):
				add(indexed(field, i), a.String(), "duplicate address", nil)
			case !familyOK(a):
				add(indexed(field, i), a.String(), "no ClusterIP of this address family", nil)
			}
		}
	}
	checkVIPs("spec.externalIPs", p.ExternalIPs)
	checkVIPs("status.loadBalancer.ingress", p.LoadBalancerIPs)
	for i, r := range p.LoadBalancerSourceRanges {
		f := "spec.loadBalancerSourceRanges"
		switch {
		case !r.IsValid() || r.Addr().Zone() != "" || r.Addr().Is4In6():
			add(indexed(f, i), r.String(), "not a canonical CIDR", nil)
		case r != r.Masked():
			add(indexed(f, i), r.String(), "host bits set", nil)
		}
	}

	switch p.Type {
	case TypeNodePort:
		if p.NodePort == 0 {
			add("spec.ports.nodePort", "0", "type NodePort needs a nodePort", nil)
		}
	case TypeLoadBalancer:
	default:
		if p.NodePort != 0 {
			add("spec.ports.nodePort", strconv.Itoa(int(p.NodePort)), "only NodePort and LoadBalancer Services have nodePorts", nil)
		}
	}
	if p.HealthCheckNodePort != 0 {
		hc := strconv.Itoa(int(p.HealthCheckNodePort))
		if p.Type != TypeLoadBalancer || p.ExternalTrafficPolicy != PolicyLocal {
			add("spec.healthCheckNodePort", hc, "only for type LoadBalancer with externalTrafficPolicy Local", nil)
		} else if p.HealthCheckNodePort == p.NodePort {
			add("spec.healthCheckNodePort", hc, "equals the port's nodePort", nil)
		}
	}
	if p.AffinityTimeoutSeconds < 0 || p.AffinityTimeoutSeconds > MaxAffinityTimeoutSecs {
		add("spec.sessionAffinityConfig.clientIP.timeoutSeconds", strconv.Itoa(p.AffinityTimeoutSeconds),
			"must be 0-"+strconv.Itoa(MaxAffinityTimeoutSecs), nil)
	}
	for _, tp := range []struct {
		field string
		v     TrafficPolicy
	}{{"spec.internalTrafficPolicy", p.InternalTrafficPolicy}, {"spec.externalTrafficPolicy", p.ExternalTrafficPolicy}} {
		if tp.v != "" && tp.v != PolicyCluster && tp.v != PolicyLocal {
			add(tp.field, string(tp.v), "must be Cluster or Local", nil)
		}
	}
	switch p.TrafficDistribution {
	case "", DistributionPreferClose, DistributionPreferSameZone, DistributionPreferSameNode:
	default:
		add("spec.trafficDistribution", p.TrafficDistribution, "must be PreferClose, PreferSameZone or PreferSameNode", nil)
	}

	sorted := true
	for i := range p.Endpoints {
		e := &p.Endpoints[i]
		if err := CheckEndpointIP(e.IP); err != nil {
			add(indexed("endpoints", i), e.String(), "refused endpoint address", err)
			continue
		}
		if e.IP.Is4In6() {
			add(indexed("endpoints", i), e.String(), "IPv4-mapped address is not canonical", nil)
		}
		if !familyOK(e.IP) {
			add(indexed("endpoints", i), e.String(), "no ClusterIP of this address family", nil)
		}
		if e.Port == 0 {
			add(indexed("endpoints", i), e.String(), "port must be 1-65535", nil)
		}
		if i > 0 && compareEndpoint(&p.Endpoints[i-1], e) >= 0 {
			add(indexed("endpoints", i), e.String(), "endpoints not sorted or duplicated", nil)
			sorted = false
		}
	}
	member := func(e *Endpoint) bool {
		if sorted {
			_, ok := slices.BinarySearchFunc(p.Endpoints, e, func(x Endpoint, t *Endpoint) int { return compareEndpoint(&x, t) })
			return ok
		}
		return slices.ContainsFunc(p.Endpoints, func(x Endpoint) bool { return compareEndpoint(&x, e) == 0 })
	}
	for _, set := range []struct {
		field string
		eps   []Endpoint
	}{{"clusterEndpoints", p.ClusterEndpoints}, {"localEndpoints", p.LocalEndpoints}} {
		if len(set.eps) > 0 && len(set.eps) <= len(p.Endpoints) && &set.eps[0] == &p.Endpoints[0] {
			continue // shares Endpoints' array: a prefix of it
		}
		for i := range set.eps {
			e := &set.eps[i]
			if !member(e) {
				add(indexed(set.field, i), e.String(), "not among endpoints", nil)
			}
		}
	}
	return errors.Join(errs...)
}

func indexed(field string, i int) string { return field + "[" + strconv.Itoa(i) + "]" }

// vipProblem says what is wrong with a as a Service VIP, or "".
func vipProblem(a netip.Addr) string {
	switch {
	case !a.IsValid():
		return "invalid address"
	case a.Zone() != "":
		return "zoned address"
	case a.Is4In6():
		return "IPv4-mapped address is not canonical"
	case a.IsUnspecified():
		return "unspecified address"
	case a.IsMulticast():
		return "multicast address"
	}
	return ""
}

// compareEndpoint orders endpoints by address, then port.
func compareEndpoint(a, b *Endpoint) int {
	if c := a.IP.Compare(b.IP); c != 0 {
		return c
	}
	return int(a.Port) - int(b.Port)
}
