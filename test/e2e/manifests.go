//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// WriteManifest atomically replaces dir/file with a multi-document YAML file
// made of docs: a string is written as-is (for deliberately broken input),
// anything else is marshalled with sigs.k8s.io/yaml. The file is written
// next to dir and renamed in, so a watcher never sees half a file.
func WriteManifest(dir, file string, docs ...any) error {
	var parts []string
	for _, d := range docs {
		switch d := d.(type) {
		case string:
			parts = append(parts, d)
		default:
			b, err := yaml.Marshal(d)
			if err != nil {
				return fmt.Errorf("manifest %s: %w", file, err)
			}
			parts = append(parts, string(b))
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(dir), ".manifest-*")
	if err != nil {
		return fmt.Errorf("manifest %s: %w", file, err)
	}
	if _, err := tmp.WriteString(strings.Join(parts, "\n---\n")); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("manifest %s: %w", file, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("manifest %s: %w", file, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, file)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("manifest %s: %w", file, err)
	}
	return nil
}

// RemoveManifest deletes dir/file.
func RemoveManifest(dir, file string) error {
	if err := os.Remove(filepath.Join(dir, file)); err != nil {
		return fmt.Errorf("manifest %s: %w", file, err)
	}
	return nil
}

// Service returns a ClusterIP Service in namespace "default" with the given
// clusterIP ("None" for headless) and ports. Tests adjust the result.
func Service(name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  clusterIP,
			ClusterIPs: []string{clusterIP},
			Ports:      ports,
		},
	}
}

// Port returns a Service port.
func Port(name string, proto corev1.Protocol, port, target int) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: int32(port), TargetPort: intstr.FromInt32(int32(target))}
}

// Slice returns an EndpointSlice for Service svc with the Service's ports
// (name, protocol, numeric targetPort) and the given endpoints. family is
// "IPv4" or "IPv6"; the slice is named svc-<family>-<suffix>.
func Slice(svc *corev1.Service, family discoveryv1.AddressType, suffix string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      strings.ToLower(fmt.Sprintf("%s-%s-%s", svc.Name, family, suffix)),
			Namespace: svc.Namespace,
			Labels:    map[string]string{discoveryv1.LabelServiceName: svc.Name},
		},
		AddressType: family,
		Endpoints:   eps,
	}
	if s.Endpoints == nil {
		s.Endpoints = []discoveryv1.Endpoint{}
	}
	for _, p := range svc.Spec.Ports {
		name, proto, port := p.Name, p.Protocol, int32(p.TargetPort.IntValue())
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
	}
	return s
}

// EP returns a ready IPv4 endpoint for pod on its node.
func EP(p *Pod) discoveryv1.Endpoint { return endpoint(p, p.IPv4) }

// EP6 returns a ready IPv6 endpoint for pod on its node.
func EP6(p *Pod) discoveryv1.Endpoint { return endpoint(p, p.IPv6) }

func endpoint(p *Pod, addr string) discoveryv1.Endpoint {
	node := p.Node.Name
	return discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Conditions: Conditions(true, true, false),
		NodeName:   &node,
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: p.Name},
	}
}

// Conditions returns endpoint conditions.
func Conditions(ready, serving, terminating bool) discoveryv1.EndpointConditions {
	return discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}
}

// NodeObject returns a v1 Node for n with the given zone label ("" for none)
// and n's LAN addresses as InternalIPs, as a kubelet would report them.
func NodeObject(n *Node, zone string) *corev1.Node {
	name := n.Name
	obj := &corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Spec: corev1.NodeSpec{PodCIDRs: []string{
			fmt.Sprintf("10.244.%d.0/24", n.Index), fmt.Sprintf("fd00:10:244:%d::/64", n.Index)}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: n.IPv4},
			{Type: corev1.NodeInternalIP, Address: n.IPv6},
			{Type: corev1.NodeHostName, Address: name},
		}},
	}
	if zone != "" {
		obj.Labels[corev1.LabelTopologyZone] = zone
	}
	return obj
}
