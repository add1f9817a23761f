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

func (n *ynode) strs() ([]string, bool) {
	if n.kind != 's' {
		return nil, false
	}
	out := make([]string, len(n.items))
	for i, it := range n.items {
		var ok bool
		if out[i], ok = it.str(); !ok {
			return nil, false
		}
	}
	return out, true
}

func (n *ynode) strMap() (map[string]string, bool) {
	if n.kind != 'm' {
		return nil, false
	}
	out := make(map[string]string, len(n.keys))
	for i, k := range n.keys {
		v, ok := n.vals[i].str()
		if !ok {
			return nil, false
		}
		out[k] = v
	}
	return out, true
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

func strPtr(n *ynode) (*string, bool) {
	s, ok := n.str()
	return &s, ok
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

// fastMeta fills the ObjectMeta fields the fast path knows.
func fastMeta(meta *ynode, om *metav1.ObjectMeta) bool {
	return meta.each(func(k string, v *ynode) bool {
		var ok bool
		switch k {
		case "name":
			om.Name, ok = v.str()
		case "namespace":
			om.Namespace, ok = v.str()
		case "labels":
			om.Labels, ok = v.strMap()
		case "annotations":
			om.Annotations, ok = v.strMap()
		}
		return ok
	})
}

// fastService decodes a v1 Service document (header already checked).
func fastService(root *ynode) (*corev1.Service, bool) {
	svc := &corev1.Service{}
	ok := root.each(func(k string, v *ynode) bool {
		switch k {
		case "apiVersion", "kind":
			return true
		case "metadata":
			return fastMeta(v, &svc.ObjectMeta)
		case "spec":
			return fastServiceSpec(v, &svc.Spec)
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
								s, ok := v.str()
								m := corev1.LoadBalancerIPMode(s)
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

func fastServiceSpec(n *ynode, spec *corev1.ServiceSpec) bool {
	return n.each(func(k string, v *ynode) bool {
		var ok bool
		var s string
		switch k {
		case "type":
			s, ok = v.str()
			spec.Type = corev1.ServiceType(s)
		case "clusterIP":
			spec.ClusterIP, ok = v.str()
		case "clusterIPs":
			spec.ClusterIPs, ok = v.strs()
		case "externalIPs":
			spec.ExternalIPs, ok = v.strs()
		case "loadBalancerSourceRanges":
			spec.LoadBalancerSourceRanges, ok = v.strs()
		case "loadBalancerIP":
			spec.LoadBalancerIP, ok = v.str()
		case "externalName":
			spec.ExternalName, ok = v.str()
		case "selector":
			spec.Selector, ok = v.strMap()
		case "sessionAffinity":
			s, ok = v.str()
			spec.SessionAffinity = corev1.ServiceAffinity(s)
		case "externalTrafficPolicy":
			s, ok = v.str()
			spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicy(s)
		case "internalTrafficPolicy":
			s, ok = v.str()
			p := corev1.ServiceInternalTrafficPolicy(s)
			spec.InternalTrafficPolicy = &p
		case "ipFamilyPolicy":
			s, ok = v.str()
			p := corev1.IPFamilyPolicy(s)
			spec.IPFamilyPolicy = &p
		case "trafficDistribution":
			spec.TrafficDistribution, ok = strPtr(v)
		case "healthCheckNodePort":
			spec.HealthCheckNodePort, ok = v.i32()
		case "publishNotReadyAddresses":
			spec.PublishNotReadyAddresses, ok = v.boolean()
		case "ipFamilies":
			var fs []string
			if fs, ok = v.strs(); ok {
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
			spec.Ports = make([]corev1.ServicePort, 0, len(v.items))
			ok = v.eachItem(func(v *ynode) bool {
				var sp corev1.ServicePort
				ok := v.each(func(k string, v *ynode) bool {
					var ok bool
					switch k {
					case "name":
						sp.Name, ok = v.str()
					case "protocol":
						var s string
						s, ok = v.str()
						sp.Protocol = corev1.Protocol(s)
					case "port":
						sp.Port, ok = v.i32()
					case "nodePort":
						sp.NodePort, ok = v.i32()
					case "appProtocol":
						sp.AppProtocol, ok = strPtr(v)
					case "targetPort":
						if i, isInt := v.i32(); isInt {
							sp.TargetPort, ok = intstr.FromInt32(i), true
						} else if s, isStr := v.str(); isStr {
							sp.TargetPort, ok = intstr.FromString(s), true
						}
					}
					return ok
				})
				spec.Ports = append(spec.Ports, sp)
				return ok
			})
		}
		return ok
	})
}

// fastSlice decodes a discovery.k8s.io/v1 EndpointSlice document.
func fastSlice(root *ynode) (*discoveryv1.EndpointSlice, bool) {
	es := &discoveryv1.EndpointSlice{}
	ok := root.each(func(k string, v *ynode) bool {
		var ok bool
		switch k {
		case "apiVersion", "kind":
			return true
		case "metadata":
			return fastMeta(v, &es.ObjectMeta)
		case "addressType":
			var s string
			s, ok = v.str()
			es.AddressType = discoveryv1.AddressType(s)
		case "ports":
			es.Ports = make([]discoveryv1.EndpointPort, 0, len(v.items))
			ok = v.eachItem(func(v *ynode) bool {
				var ep discoveryv1.EndpointPort
				ok := v.each(func(k string, v *ynode) bool {
					var ok bool
					switch k {
					case "name":
						ep.Name, ok = strPtr(v)
					case "protocol":
						var s string
						s, ok = v.str()
						p := corev1.Protocol(s)
						ep.Protocol = &p
					case "port":
						var i int32
						i, ok = v.i32()
						ep.Port = &i
					case "appProtocol":
						ep.AppProtocol, ok = strPtr(v)
					}
					return ok
				})
				es.Ports = append(es.Ports, ep)
				return ok
			})
		case "endpoints":
			es.Endpoints = make([]discoveryv1.Endpoint, 0, len(v.items))
			ok = v.eachItem(func(v *ynode) bool {
				var ep discoveryv1.Endpoint
				ok := v.each(func(k string, v *ynode) bool {
					var ok bool
					switch k {
					case "addresses":
						ep.Addresses, ok = v.strs()
					case "nodeName":
						ep.NodeName, ok = strPtr(v)
					case "zone":
						ep.Zone, ok = strPtr(v)
					case "hostname":
						ep.Hostname, ok = strPtr(v)
					case "conditions":
						ok = v.each(func(k string, v *ynode) bool {
							b, ok := v.boolean()
							switch k {
							case "ready":
								ep.Conditions.Ready = &b
							case "serving":
								ep.Conditions.Serving = &b
							case "terminating":
								ep.Conditions.Terminating = &b
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
		}
		return ok
	})
	return es, ok
}
