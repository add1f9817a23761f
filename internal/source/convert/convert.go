// Package convert is the one place where Kubernetes API objects become
// vipproxy model types. Both sources (kube and manifests) call it, so a
// Service means the same thing whichever way it arrives.
//
// Conversion never fails as a whole: it returns what it could use and a
// Problem for every field it refused. A Problem names the object
// ("Service default/web"), the JSON path of the field
// ("spec.ports[1].port") and the bad value. A refused object comes back as
// the zero value (empty Name) with at least one Problem saying why.
package convert

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/vipproxy/vipproxy/internal/model"
)

// annotationLBSourceRanges is the legacy annotation read when
// spec.loadBalancerSourceRanges is empty, as upstream does.
const annotationLBSourceRanges = "service.beta.kubernetes.io/load-balancer-source-ranges"

// Proxied reports whether vipproxy should proxy svc at all: false for
// Services labelled service.kubernetes.io/service-proxy-name (any value:
// vipproxy has no proxy name, like kube-proxy) or
// service.kubernetes.io/headless, and for nil.
func Proxied(svc *corev1.Service) bool {
	if svc == nil {
		return false
	}
	if _, ok := svc.Labels[model.LabelServiceProxyName]; ok {
		return false
	}
	if _, ok := svc.Labels[model.LabelHeadless]; ok {
		return false
	}
	return true
}

// problems collects the Problems of one object.
type problems struct {
	// kind, ns and name name the object; object is "kind ns/name", built
	// for the first Problem (most objects have none).
	kind, ns, name string
	object         string
	list           []model.Problem
	fatal          bool
	strict         bool // standalone: see StrictService
}

// refuse records a Problem that makes the whole object unusable.
func (p *problems) refuse(field, value, reason string, args ...any) {
	p.fatal = true
	p.add(field, value, reason, args...)
}

// add records a Problem for a field that is dropped while the rest of the
// object stays usable.
func (p *problems) add(field, value, reason string, args ...any) {
	if len(args) > 0 {
		reason = fmt.Sprintf(reason, args...)
	}
	if p.object == "" {
		p.object = p.kind + " " + p.ns + "/" + p.name
	}
	p.list = append(p.list, model.Problem{Object: p.object, Field: field, Value: value, Reason: reason})
}

// Service converts a v1 Service. The namespace is used as given (callers
// default an empty one). The Service is refused whole (zero value plus
// Problems) when a field it cannot work without is bad: metadata.name,
// spec.type, spec.clusterIP(s), spec.ipFamilies, spec.ipFamilyPolicy, any
// of spec.ports, spec.sessionAffinity and its timeout, the traffic
// policies and spec.healthCheckNodePort. Bad entries of spec.externalIPs,
// spec.loadBalancerSourceRanges and status.loadBalancer.ingress are
// dropped with a Problem and the Service is kept.
//
// Empty spec.clusterIP(s) are left empty (a standalone allocator fills
// them); "None" makes the Service headless. Load-balancer ingress counts
// only for entries with an ip and ipMode unset or VIP. Conversion does not
// look at the proxy-name / headless labels: see Proxied.
func Service(svc *corev1.Service) (model.Service, []model.Problem) {
	return service(svc, false)
}

// StrictService is Service for standalone mode, where vipproxy is the
// only validator: it also refuses what the API server's strict
// validation refuses, leading-zero IPv4 octets ("010.96.0.10",
// model.ErrLeadingZero) in every address and CIDR field, with the same
// consequence as any other bad value of that field (the Service refused
// for a cluster IP, the entry dropped for externalIPs). Service reads
// them as decimal and warns.
func StrictService(svc *corev1.Service) (model.Service, []model.Problem) {
	return service(svc, true)
}

func service(svc *corev1.Service, strict bool) (model.Service, []model.Problem) {
	if svc == nil {
		return model.Service{}, nil
	}
	p := &problems{kind: "Service", ns: svc.Namespace, name: svc.Name, strict: strict}
	out := model.Service{ServiceName: model.ServiceName{Namespace: svc.Namespace, Name: svc.Name}}
	if svc.Name == "" {
		p.refuse("metadata.name", "", "name is required")
	}
	spec := &svc.Spec

	switch spec.Type {
	case "", corev1.ServiceTypeClusterIP:
		out.Type = model.TypeClusterIP
	case corev1.ServiceTypeNodePort:
		out.Type = model.TypeNodePort
	case corev1.ServiceTypeLoadBalancer:
		out.Type = model.TypeLoadBalancer
	case corev1.ServiceTypeExternalName:
		// ExternalName Services are DNS-only: nothing to proxy, nothing to check.
		out.Type = model.TypeExternalName
		if p.fatal {
			return model.Service{}, p.list
		}
		return out, p.list
	default:
		p.refuse("spec.type", string(spec.Type), "must be ClusterIP, NodePort, LoadBalancer or ExternalName")
	}

	convertClusterIPs(p, spec, &out)
	convertFamilies(p, spec, &out)
	convertPorts(p, spec, &out)

	for i, s := range spec.ExternalIPs {
		a, err := p.addr(func() string { return fmt.Sprintf("spec.externalIPs[%d]", i) }, s)
		if err != nil {
			p.add(fmt.Sprintf("spec.externalIPs[%d]", i), s, "%v; entry ignored", err)
			continue
		}
		out.ExternalIPs = append(out.ExternalIPs, a)
	}

	ranges, field := spec.LoadBalancerSourceRanges, "spec.loadBalancerSourceRanges[%d]"
	if len(ranges) == 0 && svc.Annotations[annotationLBSourceRanges] != "" {
		ranges = strings.Split(svc.Annotations[annotationLBSourceRanges], ",")
		field = "metadata.annotations[" + annotationLBSourceRanges + "][%d]"
	}
	for i, s := range ranges {
		pfx, err := p.prefix(fmt.Sprintf(field, i), strings.TrimSpace(s))
		if err != nil {
			p.add(fmt.Sprintf(field, i), s, "%v; entry ignored", err)
			continue
		}
		out.LoadBalancerSourceRanges = append(out.LoadBalancerSourceRanges, pfx)
	}

	for i, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" {
			continue // hostname-only ingress: nothing to program
		}
		if ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP {
			if *ing.IPMode != corev1.LoadBalancerIPModeProxy {
				p.add(fmt.Sprintf("status.loadBalancer.ingress[%d].ipMode", i), string(*ing.IPMode), "must be VIP or Proxy; entry ignored")
			}
			continue
		}
		a, err := p.addr(func() string { return fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i) }, ing.IP)
		if err != nil {
			p.add(fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), ing.IP, "%v; entry ignored", err)
			continue
		}
		out.LoadBalancerIPs = append(out.LoadBalancerIPs, a)
	}

	switch spec.SessionAffinity {
	case "", corev1.ServiceAffinityNone:
	case corev1.ServiceAffinityClientIP:
		out.AffinityTimeoutSeconds = model.DefaultAffinityTimeoutSecs
		if c := spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t := *c.ClientIP.TimeoutSeconds
			if t < 1 || t > model.MaxAffinityTimeoutSecs {
				p.refuse("spec.sessionAffinityConfig.clientIP.timeoutSeconds", strconv.Itoa(int(t)),
					"must be between 1 and %d", model.MaxAffinityTimeoutSecs)
			}
			out.AffinityTimeoutSeconds = int(t)
		}
	default:
		p.refuse("spec.sessionAffinity", string(spec.SessionAffinity), "must be None or ClientIP")
	}

	switch spec.ExternalTrafficPolicy {
	case "", corev1.ServiceExternalTrafficPolicyCluster:
		out.ExternalTrafficPolicy = model.PolicyCluster
	case corev1.ServiceExternalTrafficPolicyLocal:
		out.ExternalTrafficPolicy = model.PolicyLocal
	default:
		p.refuse("spec.externalTrafficPolicy", string(spec.ExternalTrafficPolicy), "must be Cluster or Local")
	}
	out.InternalTrafficPolicy = model.PolicyCluster
	if itp := spec.InternalTrafficPolicy; itp != nil {
		switch *itp {
		case corev1.ServiceInternalTrafficPolicyCluster:
		case corev1.ServiceInternalTrafficPolicyLocal:
			out.InternalTrafficPolicy = model.PolicyLocal
		default:
			p.refuse("spec.internalTrafficPolicy", string(*itp), "must be Cluster or Local")
		}
	}

	if hc := spec.HealthCheckNodePort; hc < 0 || hc > 65535 {
		p.refuse("spec.healthCheckNodePort", strconv.Itoa(int(hc)), "must be between 0 and 65535")
	} else {
		out.HealthCheckNodePort = uint16(hc)
	}
	if spec.TrafficDistribution != nil {
		out.TrafficDistribution = *spec.TrafficDistribution
	}
	out.Balance = balance(p, svc.Annotations[model.AnnotationBalance])
	if v := svc.Annotations[model.AnnotationSlowStart]; v != "" {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || d <= 0 || d > model.MaxSlowStart {
			p.add("metadata.annotations["+model.AnnotationSlowStart+"]", v, "must be a duration between 1s and %v (e.g. 30s); no slow start", model.MaxSlowStart)
		} else {
			out.SlowStart = d
		}
	}
	if v := strings.TrimSpace(svc.Annotations[model.AnnotationDrain]); v != "" && v != "keep" {
		after, ok := strings.CutPrefix(v, "reset-after=")
		d, err := time.ParseDuration(after)
		if !ok || err != nil || d < 0 || d > model.MaxSlowStart {
			p.add("metadata.annotations["+model.AnnotationDrain+"]", v, "must be keep or reset-after=DURATION (at most %v); flows are kept", model.MaxSlowStart)
		} else {
			out.DrainReset = max(d, time.Nanosecond) // reset-after=0s: at once
		}
	}
	switch v := svc.Annotations[model.AnnotationOutlierEjection]; v {
	case "":
	case "on":
		out.OutlierEjection = "on" // a constant: v may point into a manifest's bytes
	case "off":
		out.OutlierEjection = "off"
	default:
		p.add("metadata.annotations["+model.AnnotationOutlierEjection+"]", v, "must be on or off; the node's default is used")
	}

	if p.fatal {
		return model.Service{}, p.list
	}
	return out, p.list
}

// convertClusterIPs fills ClusterIPs and Headless from spec.clusterIP and
// spec.clusterIPs (which must agree on the primary when both are set).
func convertClusterIPs(p *problems, spec *corev1.ServiceSpec, out *model.Service) {
	ips, field := spec.ClusterIPs, "spec.clusterIPs[%d]"
	if len(ips) == 0 && spec.ClusterIP != "" {
		ips, field = []string{spec.ClusterIP}, "spec.clusterIP"
	} else if len(ips) > 0 && spec.ClusterIP != "" && spec.ClusterIP != ips[0] {
		p.refuse("spec.clusterIP", spec.ClusterIP, "must equal spec.clusterIPs[0] (%q)", ips[0])
		return
	}
	name := func(i int) string {
		if field == "spec.clusterIP" {
			return field
		}
		return fmt.Sprintf(field, i)
	}
	if len(ips) > 2 {
		p.refuse("spec.clusterIPs", strings.Join(ips, ","), "at most two cluster IPs (one per family)")
		return
	}
	if len(ips) > 0 && ips[0] == corev1.ClusterIPNone {
		if len(ips) > 1 {
			p.refuse("spec.clusterIPs", strings.Join(ips, ","), "\"None\" must be the only cluster IP")
			return
		}
		out.Headless = true
		return
	}
	for i, s := range ips {
		a, err := p.addr(func() string { return name(i) }, s)
		if err != nil {
			p.refuse(name(i), s, "%v", err)
			return
		}
		// Loopback VIPs stay allowed: the userspace mode serves a loopback range.
		if a.IsUnspecified() || a.IsMulticast() {
			p.refuse(name(i), s, "not usable as a cluster IP (unspecified or multicast)")
			return
		}
		if i == 1 && a.Is4() == out.ClusterIPs[0].Is4() {
			p.refuse(name(i), s, "second cluster IP must be of the other IP family")
			return
		}
		out.ClusterIPs = append(out.ClusterIPs, a)
	}
}

// convertFamilies fills IPFamilies (from spec.ipFamilies, else from the
// cluster IPs) and IPFamilyPolicy.
func convertFamilies(p *problems, spec *corev1.ServiceSpec, out *model.Service) {
	if len(spec.IPFamilies) > 2 {
		p.refuse("spec.ipFamilies", fmt.Sprint(spec.IPFamilies), "at most two families")
		return
	}
	for i, f := range spec.IPFamilies {
		var fam model.AddressType
		switch f {
		case corev1.IPv4Protocol:
			fam = model.IPv4
		case corev1.IPv6Protocol:
			fam = model.IPv6
		default:
			p.refuse(fmt.Sprintf("spec.ipFamilies[%d]", i), string(f), "must be IPv4 or IPv6")
			return
		}
		if i == 1 && fam == out.IPFamilies[0] {
			p.refuse("spec.ipFamilies[1]", string(f), "duplicate IP family")
			return
		}
		if i < len(out.ClusterIPs) && familyOf(out.ClusterIPs[i]) != fam {
			p.refuse(fmt.Sprintf("spec.ipFamilies[%d]", i), string(f), "does not match cluster IP %s", out.ClusterIPs[i])
			return
		}
		out.IPFamilies = append(out.IPFamilies, fam)
	}
	if len(out.IPFamilies) == 0 {
		for _, a := range out.ClusterIPs {
			out.IPFamilies = append(out.IPFamilies, familyOf(a))
		}
	}
	if spec.IPFamilyPolicy != nil {
		switch pol := *spec.IPFamilyPolicy; pol {
		case corev1.IPFamilyPolicySingleStack, corev1.IPFamilyPolicyPreferDualStack, corev1.IPFamilyPolicyRequireDualStack:
			out.IPFamilyPolicy = string(pol)
		default:
			p.refuse("spec.ipFamilyPolicy", string(pol), "must be SingleStack, PreferDualStack or RequireDualStack")
		}
	}
}

// convertPorts fills Ports. Every port must be valid; names must be unique
// (and present when there is more than one port), port/protocol pairs too.
func convertPorts(p *problems, spec *corev1.ServiceSpec, out *model.Service) {
	if len(spec.Ports) == 0 && !out.Headless {
		p.refuse("spec.ports", "", "at least one port is required")
		return
	}
	names := map[string]int{}
	pairs := map[string]int{}
	for i, sp := range spec.Ports {
		f := func() string { return "spec.ports[" + strconv.Itoa(i) + "]" } // only for Problems: no allocation per port
		port := model.ServicePortSpec{Name: sp.Name}
		if j, dup := names[sp.Name]; dup {
			p.refuse(f()+".name", sp.Name, "duplicate of spec.ports[%d].name", j)
		} else if sp.Name == "" && len(spec.Ports) > 1 {
			p.refuse(f()+".name", "", "name is required when there is more than one port")
		}
		names[sp.Name] = i
		switch sp.Protocol {
		case "", corev1.ProtocolTCP:
			port.Protocol = model.TCP
		case corev1.ProtocolUDP:
			port.Protocol = model.UDP
		case corev1.ProtocolSCTP:
			port.Protocol = model.SCTP
		default:
			p.refuse(f()+".protocol", string(sp.Protocol), "must be TCP, UDP or SCTP")
		}
		if sp.Port < 1 || sp.Port > 65535 {
			p.refuse(f()+".port", strconv.Itoa(int(sp.Port)), "must be between 1 and 65535")
		} else {
			port.Port = uint16(sp.Port)
		}
		key := strconv.Itoa(int(sp.Port)) + "/" + string(port.Protocol)
		if j, dup := pairs[key]; dup && port.Port != 0 && port.Protocol != "" {
			p.refuse(f(), key, "duplicate of spec.ports[%d]", j)
		}
		pairs[key] = i
		switch {
		case sp.NodePort < 0 || sp.NodePort > 65535:
			p.refuse(f()+".nodePort", strconv.Itoa(int(sp.NodePort)), "must be between 0 and 65535")
		case sp.NodePort != 0 && out.Type != model.TypeNodePort && out.Type != model.TypeLoadBalancer:
			p.refuse(f()+".nodePort", strconv.Itoa(int(sp.NodePort)), "only allowed for type NodePort or LoadBalancer")
		default:
			port.NodePort = uint16(sp.NodePort)
		}
		out.Ports = append(out.Ports, port)
	}
}

// balance reads a Service's AnnotationBalance value. An unknown value is
// a Problem and leaves the default: the Service itself is still proxied.
func balance(p *problems, v string) model.Balance {
	if v == "" {
		return model.BalanceDefault
	}
	for _, b := range model.Balances {
		if v == string(b) {
			return b
		}
	}
	p.add("metadata.annotations["+model.AnnotationBalance+"]", v, "must be one of %v; the mode's default is used", model.Balances)
	return model.BalanceDefault
}

// weight reads an EndpointSlice's AnnotationWeight (0, meaning 1, when
// absent). A bad value is a Problem and leaves weight 1.
func weight(p *problems, ann map[string]string) uint8 {
	v, ok := ann[model.AnnotationWeight]
	if !ok {
		return 0
	}
	w, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || w < 1 || w > model.MaxWeight {
		p.add("metadata.annotations["+model.AnnotationWeight+"]", v, "must be an integer between 1 and %d; weight 1 is used", model.MaxWeight)
		return 0
	}
	return uint8(w)
}

func familyOf(a netip.Addr) model.AddressType {
	if a.Is4() {
		return model.IPv4
	}
	return model.IPv6
}

// EndpointSlice converts a discovery/v1 EndpointSlice. Slices that are
// not vipproxy's business come back as the zero value without Problems:
// FQDN slices and slices without the kubernetes.io/service-name label.
// A slice with a missing name or an unknown address type is refused (zero
// value plus a Problem). Bad ports, addresses of the wrong family and
// unparsable addresses are dropped with a Problem; an endpoint left
// without addresses is dropped. Conditions are defaulted as the API
// documents: nil ready is true, nil serving is ready, nil terminating is
// false.
func EndpointSlice(es *discoveryv1.EndpointSlice) (model.EndpointSlice, []model.Problem) {
	return endpointSlice(es, false)
}

// StrictEndpointSlice is EndpointSlice for standalone mode: an address
// that does not parse (a typo such as "10.240.1.300", or leading zeros)
// refuses the whole slice instead of dropping the address, so that the
// source keeps the slice's last good version rather than silently
// shrinking the Service to fewer (or no) endpoints. Addresses refused by
// policy (loopback, link-local, …) are still dropped alone, by model.Build.
func StrictEndpointSlice(es *discoveryv1.EndpointSlice) (model.EndpointSlice, []model.Problem) {
	return endpointSlice(es, true)
}

func endpointSlice(es *discoveryv1.EndpointSlice, strict bool) (model.EndpointSlice, []model.Problem) {
	if es == nil {
		return model.EndpointSlice{}, nil
	}
	svcName := es.Labels[discoveryv1.LabelServiceName]
	if svcName == "" || es.AddressType == discoveryv1.AddressTypeFQDN {
		return model.EndpointSlice{}, nil
	}
	p := &problems{kind: "EndpointSlice", ns: es.Namespace, name: es.Name, strict: strict}
	out := model.EndpointSlice{
		Name:    es.Name,
		Service: model.ServiceName{Namespace: es.Namespace, Name: svcName},
	}
	if es.Name == "" {
		p.refuse("metadata.name", "", "name is required")
	}
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4:
		out.AddressType = model.IPv4
	case discoveryv1.AddressTypeIPv6:
		out.AddressType = model.IPv6
	default:
		p.refuse("addressType", string(es.AddressType), "must be IPv4, IPv6 or FQDN")
	}
	if p.fatal {
		return model.EndpointSlice{}, p.list
	}

	if len(es.Ports) > 0 {
		out.Ports = make([]model.EndpointPort, 0, len(es.Ports))
	}
	for i, ep := range es.Ports {
		f := func() string { return "ports[" + strconv.Itoa(i) + "]" }
		port := model.EndpointPort{Protocol: model.TCP}
		if ep.Name != nil {
			port.Name = *ep.Name
		}
		if ep.Protocol != nil {
			switch *ep.Protocol {
			case corev1.ProtocolTCP:
			case corev1.ProtocolUDP:
				port.Protocol = model.UDP
			case corev1.ProtocolSCTP:
				port.Protocol = model.SCTP
			default:
				p.add(f()+".protocol", string(*ep.Protocol), "must be TCP, UDP or SCTP; port ignored")
				continue
			}
		}
		if ep.Port == nil {
			p.add(f()+".port", "", "port is required; port ignored")
			continue
		}
		if *ep.Port < 1 || *ep.Port > 65535 {
			p.add(f()+".port", strconv.Itoa(int(*ep.Port)), "must be between 1 and 65535; port ignored")
			continue
		}
		port.Port = uint16(*ep.Port)
		out.Ports = append(out.Ports, port)
	}

	weight := weight(p, es.Annotations)

	if len(es.Endpoints) > 0 {
		out.Endpoints = make([]model.SliceEndpoint, 0, len(es.Endpoints))
	}
	// The endpoints of a slice often share a node and zone: the last
	// location is reused rather than interned again.
	var lastNode, lastZone string
	var lastLoc model.Loc
	haveLoc := false
	for i, e := range es.Endpoints {
		f := func() string { return "endpoints[" + strconv.Itoa(i) + "]" }
		se := model.SliceEndpoint{Ready: true, Weight: weight}
		if len(e.Addresses) == 0 {
			p.add(f()+".addresses", "", "at least one address is required; endpoint ignored")
			continue
		}
		// Every address is checked; the first valid one is kept (the
		// one kube-proxy uses).
		for j, s := range e.Addresses {
			field := func() string { return f() + ".addresses[" + strconv.Itoa(j) + "]" }
			a, err := p.addr(field, s)
			if err != nil {
				if p.strict {
					// Standalone: a typo must not silently shrink the
					// Service; the whole slice is refused and its last
					// good version stays in force.
					p.refuse(field(), s, "%v; slice refused", err)
					continue
				}
				p.add(field(), s, "%v; address ignored", err)
				continue
			}
			if familyOf(a) != out.AddressType {
				p.add(field(), s, "not an %s address; address ignored", out.AddressType)
				continue
			}
			if !se.Address.IsValid() {
				se.Address = a
			}
		}
		if !se.Address.IsValid() {
			continue
		}
		c := e.Conditions
		if c.Ready != nil {
			se.Ready = *c.Ready
		}
		se.Serving = se.Ready
		if c.Serving != nil {
			se.Serving = *c.Serving
		}
		if c.Terminating != nil {
			se.Terminating = *c.Terminating
		}
		var node, zone string
		if e.NodeName != nil {
			node = *e.NodeName
		}
		if e.Zone != nil {
			zone = *e.Zone
		}
		if node != lastNode || zone != lastZone || !haveLoc {
			lastNode, lastZone, lastLoc, haveLoc = node, zone, model.At(node, zone), true
		}
		se.Loc = lastLoc
		if h := e.Hints; h != nil && len(h.ForZones)+len(h.ForNodes) > 0 {
			var zones, nodes []string
			for _, z := range h.ForZones {
				zones = append(zones, z.Name)
			}
			for _, n := range h.ForNodes {
				nodes = append(nodes, n.Name)
			}
			se.Loc = se.Loc.WithHints(zones, nodes)
		}
		out.Endpoints = append(out.Endpoints, se)
	}
	if len(out.Ports) == 0 {
		out.Ports = nil // as without preallocation
	}
	if len(out.Endpoints) == 0 {
		out.Endpoints = nil
	}
	if p.fatal {
		return model.EndpointSlice{}, p.list
	}
	return out, p.list
}

// Node converts a v1 Node: name, a copy of its labels, its InternalIP and
// ExternalIP addresses and its pod CIDRs (unparsable ones skipped), Deleting when it has a
// deletionTimestamp and ToBeDeleted when it carries the
// ToBeDeletedByClusterAutoscaler taint. Node(nil) is nil.
func Node(n *corev1.Node) *model.Node {
	if n == nil {
		return nil
	}
	out := &model.Node{Name: n.Name, Deleting: n.DeletionTimestamp != nil}
	if len(n.Labels) > 0 {
		out.Labels = make(map[string]string, len(n.Labels))
		for k, v := range n.Labels {
			out.Labels[k] = v
		}
	}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := parseAddr(a.Address); err == nil {
			out.Addresses = append(out.Addresses, ip)
		}
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := parsePrefix(c); err == nil {
			out.PodCIDRs = append(out.PodCIDRs, p)
		}
	}
	for _, t := range n.Spec.Taints {
		if t.Key == model.TaintToBeDeletedByAutoscale {
			out.ToBeDeleted = true
		}
	}
	return out
}
