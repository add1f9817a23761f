package manifests

// The fast path: documents fastyaml accepts skip the strict decode; their
// strings are copied out of the file before the entries are kept.

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/source/manifests/fastyaml"
)

// decodeFast decodes doc with fd, reporting false when the strict path
// must do it.
func decodeFast(fd *fastyaml.Decoder, file string, where place, doc string) ([]entry, bool) {
	obj, ok := fd.Decode(doc)
	if !ok {
		return nil, false
	}
	var h header
	var kind string
	switch o := obj.(type) {
	case *corev1.Service:
		h.APIVersion, kind = "v1", kindService
		h.Metadata.Name, h.Metadata.Namespace = o.Name, o.Namespace
	case *discoveryv1.EndpointSlice:
		h.APIVersion, kind = "discovery.k8s.io/v1", kindSlice
		h.Metadata.Name, h.Metadata.Namespace = o.Name, o.Namespace
	default:
		return nil, false
	}
	h.Kind = kind
	ns := h.Metadata.Namespace
	if ns == "" {
		ns = "default"
	}
	e := entry{where: where, key: objKey{kind, ns, h.Metadata.Name}}
	out := finish(e, func() string { return "file " + file + " " + where.String() + " (" + e.key.String() + ")" }, ns, h, obj, false)
	for i := range out {
		detach(fd.Intern, &out[i])
	}
	return out, true
}

// detach replaces every string of e that may point into the file by a
// copy from in, so the file's bytes are not kept alive by the objects.
// TestSnapshotsEqualCoversModel fails when a model type gains a field,
// to have it added here too.
func detach(in func(string) string, e *entry) {
	e.key = objKey{Kind: in(e.key.Kind), Namespace: in(e.key.Namespace), Name: in(e.key.Name)}
	if svc := e.svc; svc != nil {
		svc.Namespace, svc.Name = in(svc.Namespace), in(svc.Name)
		svc.Type = model.ServiceType(in(string(svc.Type)))
		svc.IPFamilyPolicy = in(svc.IPFamilyPolicy)
		svc.ExternalTrafficPolicy = model.TrafficPolicy(in(string(svc.ExternalTrafficPolicy)))
		svc.InternalTrafficPolicy = model.TrafficPolicy(in(string(svc.InternalTrafficPolicy)))
		svc.TrafficDistribution = in(svc.TrafficDistribution)
		for i := range svc.IPFamilies {
			svc.IPFamilies[i] = model.AddressType(in(string(svc.IPFamilies[i])))
		}
		for i := range svc.Ports {
			pt := &svc.Ports[i]
			pt.Name, pt.Protocol = in(pt.Name), model.Protocol(in(string(pt.Protocol)))
		}
	}
	if sl := e.slice; sl != nil {
		sl.Name = in(sl.Name)
		sl.Service = model.ServiceName{Namespace: in(sl.Service.Namespace), Name: in(sl.Service.Name)}
		sl.AddressType = model.AddressType(in(string(sl.AddressType)))
		for i := range sl.Ports {
			pt := &sl.Ports[i]
			pt.Name, pt.Protocol = in(pt.Name), model.Protocol(in(string(pt.Protocol)))
		}
	}
	for i := range e.problems {
		pr := &e.problems[i]
		pr.Object, pr.Field, pr.Value, pr.Reason = in(pr.Object), in(pr.Field), in(pr.Value), in(pr.Reason)
	}
}
