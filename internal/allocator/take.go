package allocator

// One Service's assignment under the lock: its ClusterIPs, NodePorts and
// health-check port, taken from the bands in order or kept from the map.

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"github.com/vipproxy/vipproxy/internal/model"
)

// assignLocked computes svc's record from its fixed values, its previous
// record and free values, marking what it takes in the ranges (where
// values held by others are already marked and prev's are not) through
// takeIP/nextIP/takePort/nextPort, which log the marks for assignOne to
// undo.
func (a *Assigner) assignLocked(m *Map, svc *model.Service, fams []model.AddressType, prev Record) (*model.Service, Record, error) {
	name := svc.ServiceName
	var rec Record

	// ClusterIPs: fixed, else kept from the record, else new.
	ips := make([]netip.Addr, len(fams))
	for i, f := range fams {
		ipr := a.ips[f]
		if i < len(svc.ClusterIPs) {
			ip := svc.ClusterIPs[i]
			if err := a.takeIP(ipr, ip); err != nil {
				if errors.Is(err, ErrAllocated) {
					err = fmt.Errorf("%w to %s", ErrAllocated, ownerOfIP(m, ip, name))
				}
				return svc, rec, &AssignError{Service: name, Field: clusterIPField(i), Value: ip.String(), Err: err}
			}
			ips[i] = ip
		}
	}
	for i, f := range fams {
		if ips[i].IsValid() {
			continue
		}
		for _, ip := range prev.ClusterIPs {
			if familyOf(ip) == f {
				if !a.ips[f].Contains(ip) {
					a.log.Warn("keeping a ClusterIP outside the service CIDR", "service", name.String(), "ip", ip, "cidr", a.ips[f].Prefix())
				}
				_ = a.takeIP(a.ips[f], ip)
				ips[i] = ip
				break
			}
		}
	}
	for i, f := range fams {
		if ips[i].IsValid() {
			continue
		}
		ip, err := a.nextIP(a.ips[f])
		if err != nil {
			return svc, rec, &AssignError{Service: name, Field: "spec.clusterIPs",
				Err: fmt.Errorf("no %s address left in %s: %w", f, a.ips[f].Prefix(), err)}
		}
		ips[i] = ip
	}
	rec.ClusterIPs = ips

	// NodePorts and the health check port: fixed first, then kept, then new.
	claim := func(field string, port uint16) error {
		err := a.takePort(port)
		if err == nil || errors.Is(err, ErrAllocated) && a.portHolders[port] == 0 {
			return nil // free, or already this Service's (one port, several protocols)
		}
		if errors.Is(err, ErrAllocated) {
			err = fmt.Errorf("%w to %s", ErrAllocated, ownerOfPort(m, port, name))
		}
		return &AssignError{Service: name, Field: field, Value: strconv.Itoa(int(port)), Err: err}
	}
	next := func(field string) (uint16, error) {
		p, err := a.nextPort()
		if err != nil {
			return 0, &AssignError{Service: name, Field: field, Err: fmt.Errorf("no port left in %s: %w", a.ports, err)}
		}
		return p, nil
	}
	var nodePorts []PortAssignment
	if wantsNodePorts(svc) {
		nodePorts = make([]PortAssignment, len(svc.Ports))
		for i, p := range svc.Ports {
			nodePorts[i] = PortAssignment{Name: p.Name, Protocol: p.Protocol}
			if p.NodePort != 0 {
				if err := claim(fmt.Sprintf("spec.ports[%d].nodePort", i), p.NodePort); err != nil {
					return svc, rec, err
				}
				nodePorts[i].NodePort = p.NodePort
			}
		}
		for i := range nodePorts {
			if nodePorts[i].NodePort != 0 {
				continue
			}
			for _, pp := range prev.NodePorts {
				if pp.Name == nodePorts[i].Name && pp.Protocol == nodePorts[i].Protocol && pp.NodePort != 0 &&
					!slices.ContainsFunc(nodePorts, func(q PortAssignment) bool { return q.NodePort == pp.NodePort }) {
					_ = a.takePort(pp.NodePort)
					nodePorts[i].NodePort = pp.NodePort
					break
				}
			}
		}
	}
	var hc uint16
	if wantsHealthCheck(svc) {
		if svc.HealthCheckNodePort != 0 {
			if err := claim("spec.healthCheckNodePort", svc.HealthCheckNodePort); err != nil {
				return svc, rec, err
			}
			hc = svc.HealthCheckNodePort
		} else if prev.HealthCheckNodePort != 0 {
			_ = a.takePort(prev.HealthCheckNodePort)
			hc = prev.HealthCheckNodePort
		}
	}
	for i := range nodePorts {
		if nodePorts[i].NodePort == 0 {
			p, err := next(fmt.Sprintf("spec.ports[%d].nodePort", i))
			if err != nil {
				return svc, rec, err
			}
			nodePorts[i].NodePort = p
		}
	}
	if wantsHealthCheck(svc) && hc == 0 {
		p, err := next("spec.healthCheckNodePort")
		if err != nil {
			return svc, rec, err
		}
		hc = p
	}
	rec.NodePorts = nodePorts
	rec.HealthCheckNodePort = hc

	if filledIn(svc, rec, fams) {
		return svc, rec, nil
	}
	out := *svc
	out.ClusterIPs = slices.Clone(rec.ClusterIPs)
	if len(fams) > 0 {
		out.IPFamilies = slices.Clone(fams)
	}
	out.Ports = slices.Clone(svc.Ports)
	for i := range nodePorts {
		out.Ports[i].NodePort = nodePorts[i].NodePort
	}
	out.HealthCheckNodePort = hc
	return &out, rec, nil
}

// filledIn reports whether svc already holds everything rec and fams
// would fill in: then it is its own assignment, not copied.
func filledIn(svc *model.Service, rec Record, fams []model.AddressType) bool {
	if !slices.Equal(svc.ClusterIPs, rec.ClusterIPs) || len(fams) > 0 && !slices.Equal(svc.IPFamilies, fams) ||
		svc.HealthCheckNodePort != rec.HealthCheckNodePort {
		return false
	}
	for i, np := range rec.NodePorts {
		if svc.Ports[i].NodePort != np.NodePort {
			return false
		}
	}
	return true
}

// takeIP, nextIP, takePort and nextPort mark a value in a range and log
// the mark so assignOne can undo it.
func (a *Assigner) takeIP(r *IPRange, ip netip.Addr) error {
	err := r.Allocate(ip)
	if err == nil {
		a.markedIPs = append(a.markedIPs, ip)
	}
	return err
}

func (a *Assigner) nextIP(r *IPRange) (netip.Addr, error) {
	ip, err := r.AllocateNext()
	if err == nil {
		a.markedIPs = append(a.markedIPs, ip)
	}
	return ip, err
}

func (a *Assigner) takePort(p uint16) error {
	err := a.ports.Allocate(p)
	if err == nil {
		a.markedPorts = append(a.markedPorts, p)
	}
	return err
}

func (a *Assigner) nextPort() (uint16, error) {
	p, err := a.ports.AllocateNext()
	if err == nil {
		a.markedPorts = append(a.markedPorts, p)
	}
	return p, err
}

// ownerOfIP and ownerOfPort find who holds a value (for error messages).
func ownerOfIP(m *Map, ip netip.Addr, self model.ServiceName) model.ServiceName {
	var owner model.ServiceName
	m.Range(func(n model.ServiceName, r Record) bool {
		if n != self && slices.Contains(r.ClusterIPs, ip) {
			owner = n
			return false
		}
		return true
	})
	return owner
}

func ownerOfPort(m *Map, port uint16, self model.ServiceName) model.ServiceName {
	var owner model.ServiceName
	m.Range(func(n model.ServiceName, r Record) bool {
		if n != self && slices.Contains(r.Ports(), port) {
			owner = n
			return false
		}
		return true
	})
	return owner
}
