package fastyaml

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Typed access. Each reports false when the node is not exactly of the
// type the field wants, as the strict JSON decoder would see it.

// str is a scalar that YAML 1.1 resolves to a string.
func (n *ynode) str() (string, bool) {
	if n.kind != 'v' {
		return "", false
	}
	if n.quoted {
		return n.val, true
	}
	s := n.val
	if special(s) {
		return "", false
	}
	c := s[0]
	if isLetter(c) || c == '/' {
		return s, true
	}
	// Digits: only dotted forms with two or more dots (IPv4 addresses and
	// CIDRs) are sure to stay strings (not ints, floats or timestamps).
	if c >= '0' && c <= '9' {
		dots := 0
		for i := 0; i < len(s); i++ {
			switch {
			case s[i] == '.':
				dots++
			case s[i] >= '0' && s[i] <= '9', s[i] == '/':
			default:
				return "", false
			}
		}
		return s, dots >= 2
	}
	return "", false
}

// i32 is a plain decimal integer in the int32 range.
func (n *ynode) i32() (int32, bool) {
	if n.kind != 'v' || n.quoted || len(n.val) > 9 {
		return 0, false
	}
	s := n.val
	if s != "0" && s[0] == '0' {
		return 0, false
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		return 0, false
	}
	return int32(v), true
}

// boolean is a plain true or false.
func (n *ynode) boolean() (bool, bool) {
	if n.kind != 'v' || n.quoted {
		return false, false
	}
	switch n.val {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

// each calls f for every key of a mapping and reports false when n is
// not a mapping or f reports false.
func (n *ynode) each(f func(k string, v *ynode) bool) bool {
	if n.kind != 'm' {
		return false
	}
	for i, k := range n.keys {
		if !f(k, n.vals[i]) {
			return false
		}
	}
	return true
}

func (n *ynode) eachItem(f func(v *ynode) bool) bool {
	if n.kind != 's' {
		return false
	}
	for _, it := range n.items {
		if !f(it) {
			return false
		}
	}
	return true
}

func setStr(dst *string) func(*ynode) bool {
	return func(n *ynode) bool {
		var ok bool
		*dst, ok = n.str()
		return ok
	}
}

// scratch is what Decode's objects are built of, reused from one
// document to the next: the objects, their lists and maps, and the values
// their pointer fields point at. An object Decode returned is valid until
// the next call.
type scratch struct {
	svc      corev1.Service
	es       discoveryv1.EndpointSlice
	svcPorts []corev1.ServicePort
	esPorts  []discoveryv1.EndpointPort
	eps      []discoveryv1.Endpoint
	// strs backs []string and *string fields, bools, i32s and protos the
	// other pointer fields. A pointer into one stays valid when a later
	// append moves it: the old array lives on until no object uses it.
	strs   []string
	bools  []bool
	i32s   []int32
	protos []corev1.Protocol
	// maps are the labels, annotations and selector maps, cleared for
	// each use.
	maps [numMaps]map[string]string
}

// The maps of scratch.
const (
	labelsMap = iota
	annotationsMap
	selectorMap
	numMaps
)

// reset readies s for the next document.
func (s *scratch) reset() {
	s.strs, s.bools, s.i32s, s.protos = s.strs[:0], s.bools[:0], s.i32s[:0], s.protos[:0]
}

func (s *scratch) strPtr(n *ynode) (*string, bool) {
	v, ok := n.str()
	s.strs = append(s.strs, v)
	return &s.strs[len(s.strs)-1], ok
}

func (s *scratch) boolPtr(b bool) *bool {
	s.bools = append(s.bools, b)
	return &s.bools[len(s.bools)-1]
}

func (s *scratch) i32Ptr(i int32) *int32 {
	s.i32s = append(s.i32s, i)
	return &s.i32s[len(s.i32s)-1]
}

func (s *scratch) protoPtr(p corev1.Protocol) *corev1.Protocol {
	s.protos = append(s.protos, p)
	return &s.protos[len(s.protos)-1]
}

// strList is a sequence of strings (empty, not nil, when the sequence is).
func (s *scratch) strList(n *ynode) ([]string, bool) {
	if n.kind != 's' {
		return nil, false
	}
	if len(n.items) == 0 {
		return []string{}, true
	}
	start := len(s.strs)
	for _, it := range n.items {
		v, ok := it.str()
		if !ok {
			return nil, false
		}
		s.strs = append(s.strs, v)
	}
	return s.strs[start:len(s.strs):len(s.strs)], true
}

// strMap is a mapping of strings, in s's map i.
func (s *scratch) strMap(n *ynode, i int) (map[string]string, bool) {
	if n.kind != 'm' {
		return nil, false
	}
	m := s.maps[i]
	if m == nil {
		m = make(map[string]string, len(n.keys))
		s.maps[i] = m
	} else {
		clear(m)
	}
	for j, k := range n.keys {
		v, ok := n.vals[j].str()
		if !ok {
			return nil, false
		}
		m[k] = v
	}
	return m, true
}

// header is what Decode checks before decoding a document's kind.
type header struct{ apiVersion, kind, name string }

// fastHeader reads apiVersion, kind and metadata.name.
func fastHeader(root *ynode) (h header, ok bool) {
	if root.kind != 'm' {
		return h, false
	}
	var meta *ynode
	ok = root.each(func(k string, v *ynode) bool {
		switch k {
		case "apiVersion":
			return setStr(&h.apiVersion)(v)
		case "kind":
			return setStr(&h.kind)(v)
		case "metadata":
			meta = v
			return v.kind == 'm'
		}
		return true
	})
	if !ok || meta == nil {
		return h, false
	}
	ok = meta.each(func(k string, v *ynode) bool {
		if k == "name" {
			return setStr(&h.name)(v)
		}
		return true
	})
	return h, ok
}

// meta fills the ObjectMeta fields the fast path knows.
func (s *scratch) meta(meta *ynode, om *metav1.ObjectMeta) bool {
	return meta.each(func(k string, v *ynode) bool {
		var ok bool
		switch k {
		case "name":
			om.Name, ok = v.str()
		case "namespace":
			om.Namespace, ok = v.str()
		case "labels":
			om.Labels, ok = s.strMap(v, labelsMap)
		case "annotations":
			om.Annotations, ok = s.strMap(v, annotationsMap)
		}
		return ok
	})
}

// service decodes a v1 Service document (header already checked).
func (s *scratch) service(root *ynode) (*corev1.Service, bool) {
	s.svc = corev1.Service{}
	svc := &s.svc
	ok := root.each(func(k string, v *ynode) bool {
		switch k {
		case "apiVersion", "kind":
			return true
		case "metadata":
			return s.meta(v, &svc.ObjectMeta)
		case "spec":
			return s.serviceSpec(v, &svc.Spec)
		case "status":
			return v.each(func(k string, v *ynode) bool {
				if k != "loadBalancer" {
					return false
				}
				return v.each(func(k string, v *ynode) bool {
					if k != "ingress" {
						return false
					}
					svc.Status.LoadBalancer.Ingress = make([]corev1.LoadBalancerIngress, 0, len(v.items))
					return v.eachItem(func(v *ynode) bool {
						var ing corev1.LoadBalancerIngress
						ok := v.each(func(k string, v *ynode) bool {
							switch k {
							case "ip":
								return setStr(&ing.IP)(v)
							case "hostname":
								return setStr(&ing.Hostname)(v)
							case "ipMode":
								str, ok := v.str()
								m := corev1.LoadBalancerIPMode(str)
								ing.IPMode = &m
								return ok
							}
							return false
						})
						svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, ing)
						return ok
					})
				})
			})
		}
		return false
	})
	return svc, ok
}

func (s *scratch) serviceSpec(n *ynode, spec *corev1.ServiceSpec) bool {
	return n.each(func(k string, v *ynode) bool {
		var ok bool
		var str string
		switch k {
		case "type":
			str, ok = v.str()
			spec.Type = corev1.ServiceType(str)
		case "clusterIP":
			spec.ClusterIP, ok = v.str()
		case "clusterIPs":
			spec.ClusterIPs, ok = s.strList(v)
		case "externalIPs":
			spec.ExternalIPs, ok = s.strList(v)
		case "loadBalancerSourceRanges":
			spec.LoadBalancerSourceRanges, ok = s.strList(v)
		case "loadBalancerIP":
			spec.LoadBalancerIP, ok = v.str()
		case "externalName":
			spec.ExternalName, ok = v.str()
		case "selector":
			spec.Selector, ok = s.strMap(v, selectorMap)
		case "sessionAffinity":
			str, ok = v.str()
			spec.SessionAffinity = corev1.ServiceAffinity(str)
		case "externalTrafficPolicy":
			str, ok = v.str()
			spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicy(str)
		case "internalTrafficPolicy":
			str, ok = v.str()
			p := corev1.ServiceInternalTrafficPolicy(str)
			spec.InternalTrafficPolicy = &p
		case "ipFamilyPolicy":
			str, ok = v.str()
			p := corev1.IPFamilyPolicy(str)
			spec.IPFamilyPolicy = &p
		case "trafficDistribution":
			spec.TrafficDistribution, ok = s.strPtr(v)
		case "healthCheckNodePort":
			spec.HealthCheckNodePort, ok = v.i32()
		case "publishNotReadyAddresses":
			spec.PublishNotReadyAddresses, ok = v.boolean()
		case "ipFamilies":
			var fs []string
			if fs, ok = s.strList(v); ok {
				spec.IPFamilies = make([]corev1.IPFamily, len(fs))
				for i, f := range fs {
					spec.IPFamilies[i] = corev1.IPFamily(f)
				}
			}
		case "sessionAffinityConfig":
			cfg := &corev1.SessionAffinityConfig{}
			spec.SessionAffinityConfig = cfg
			ok = v.each(func(k string, v *ynode) bool {
				if k != "clientIP" {
					return false
				}
				cfg.ClientIP = &corev1.ClientIPConfig{}
				return v.each(func(k string, v *ynode) bool {
					if k != "timeoutSeconds" {
						return false
					}
					t, ok := v.i32()
					cfg.ClientIP.TimeoutSeconds = &t
					return ok
				})
			})
		case "ports":
			spec.Ports = s.svcPorts[:0]
			ok = v.eachItem(func(v *ynode) bool {
				var sp corev1.ServicePort
				ok := v.each(func(k string, v *ynode) bool {
					var ok bool
					switch k {
					case "name":
						sp.Name, ok = v.str()
					case "protocol":
						var str string
						str, ok = v.str()
						sp.Protocol = corev1.Protocol(str)
					case "port":
						sp.Port, ok = v.i32()
					case "nodePort":
						sp.NodePort, ok = v.i32()
					case "appProtocol":
						sp.AppProtocol, ok = s.strPtr(v)
					case "targetPort":
						if i, isInt := v.i32(); isInt {
							sp.TargetPort, ok = intstr.FromInt32(i), true
						} else if str, isStr := v.str(); isStr {
							sp.TargetPort, ok = intstr.FromString(str), true
						}
					}
					return ok
				})
				spec.Ports = append(spec.Ports, sp)
				return ok
			})
			s.svcPorts = spec.Ports
		}
		return ok
	})
}

// slice decodes a discovery.k8s.io/v1 EndpointSlice document.
func (s *scratch) slice(root *ynode) (*discoveryv1.EndpointSlice, bool) {
	s.es = discoveryv1.EndpointSlice{}
	es := &s.es
	ok := root.each(func(k string, v *ynode) bool {
		var ok bool
		switch k {
		case "apiVersion", "kind":
			return true
		case "metadata":
			return s.meta(v, &es.ObjectMeta)
		case "addressType":
			var str string
			str, ok = v.str()
			es.AddressType = discoveryv1.AddressType(str)
		case "ports":
			es.Ports = s.esPorts[:0]
			ok = v.eachItem(func(v *ynode) bool {
				var ep discoveryv1.EndpointPort
				ok := v.each(func(k string, v *ynode) bool {
					var ok bool
					switch k {
					case "name":
						ep.Name, ok = s.strPtr(v)
					case "protocol":
						var str string
						str, ok = v.str()
						ep.Protocol = s.protoPtr(corev1.Protocol(str))
					case "port":
						var i int32
						i, ok = v.i32()
						ep.Port = s.i32Ptr(i)
					case "appProtocol":
						ep.AppProtocol, ok = s.strPtr(v)
					}
					return ok
				})
				es.Ports = append(es.Ports, ep)
				return ok
			})
			s.esPorts = es.Ports
		case "endpoints":
			es.Endpoints = s.eps[:0]
			ok = v.eachItem(func(v *ynode) bool {
				var ep discoveryv1.Endpoint
				ok := v.each(func(k string, v *ynode) bool {
					var ok bool
					switch k {
					case "addresses":
						ep.Addresses, ok = s.strList(v)
					case "nodeName":
						ep.NodeName, ok = s.strPtr(v)
					case "zone":
						ep.Zone, ok = s.strPtr(v)
					case "hostname":
						ep.Hostname, ok = s.strPtr(v)
					case "conditions":
						ok = v.each(func(k string, v *ynode) bool {
							b, ok := v.boolean()
							switch k {
							case "ready":
								ep.Conditions.Ready = s.boolPtr(b)
							case "serving":
								ep.Conditions.Serving = s.boolPtr(b)
							case "terminating":
								ep.Conditions.Terminating = s.boolPtr(b)
							default:
								return false
							}
							return ok
						})
					case "hints":
						h := &discoveryv1.EndpointHints{}
						ep.Hints = h
						ok = v.each(func(k string, v *ynode) bool {
							var ok bool
							switch k {
							case "forZones":
								h.ForZones = make([]discoveryv1.ForZone, 0, len(v.items))
								ok = v.eachItem(func(v *ynode) bool {
									var z discoveryv1.ForZone
									ok := v.each(func(k string, v *ynode) bool {
										return k == "name" && setStr(&z.Name)(v)
									})
									h.ForZones = append(h.ForZones, z)
									return ok
								})
							case "forNodes":
								h.ForNodes = make([]discoveryv1.ForNode, 0, len(v.items))
								ok = v.eachItem(func(v *ynode) bool {
									var z discoveryv1.ForNode
									ok := v.each(func(k string, v *ynode) bool {
										return k == "name" && setStr(&z.Name)(v)
									})
									h.ForNodes = append(h.ForNodes, z)
									return ok
								})
							}
							return ok
						})
					}
					return ok
				})
				es.Endpoints = append(es.Endpoints, ep)
				return ok
			})
			s.eps = es.Endpoints
		}
		return ok
	})
	return es, ok
}
