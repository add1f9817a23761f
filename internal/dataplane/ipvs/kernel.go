package ipvs

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Service flags as the kernel spells them (IP_VS_SVC_F_*).
const (
	// FlagPersistent makes a virtual server persistent: a client keeps its
	// real server for Timeout seconds (ClientIP session affinity).
	FlagPersistent uint32 = 0x0001
	// FlagHashed is set by the kernel on every hashed service; it is
	// ignored when comparing services.
	FlagHashed uint32 = 0x0002
	// FlagSched1 and FlagSched2 are the scheduler flags (for sh:
	// sh-fallback and sh-port). vipproxy never sets them.
	FlagSched1 uint32 = 0x0008
	FlagSched2 uint32 = 0x0010
)

// Schedulers are the IPVS schedulers vipproxy accepts, as kube-proxy does:
// round robin, least connection, destination hashing, source hashing,
// shortest expected delay and never queue.
var Schedulers = []string{"rr", "lc", "dh", "sh", "sed", "nq"}

// ServiceKey identifies a virtual server: address, port and protocol.
type ServiceKey struct {
	Addr     netip.Addr
	Port     uint16
	Protocol model.Protocol
}

func (k ServiceKey) String() string {
	return string(k.Protocol) + "/" + netip.AddrPortFrom(k.Addr, k.Port).String()
}

// Compare orders keys by address, port, then protocol.
func (k ServiceKey) Compare(o ServiceKey) int {
	return cmp.Or(k.Addr.Compare(o.Addr), cmp.Compare(k.Port, o.Port), strings.Compare(string(k.Protocol), string(o.Protocol)))
}

// VirtualServer is an IPVS service.
type VirtualServer struct {
	ServiceKey
	// Scheduler is the scheduler name (one of Schedulers).
	Scheduler string
	// Flags holds IP_VS_SVC_F_* bits; FlagHashed is ignored on compare.
	Flags uint32
	// Timeout is the persistence timeout in seconds (with FlagPersistent).
	Timeout uint32
}

// equal reports whether two virtual servers have the same settings,
// ignoring the kernel-set FlagHashed.
func (v VirtualServer) equal(o VirtualServer) bool {
	return v.ServiceKey == o.ServiceKey && v.Scheduler == o.Scheduler &&
		v.Flags&^FlagHashed == o.Flags&^FlagHashed && v.Timeout == o.Timeout
}

func (v VirtualServer) String() string {
	s := v.ServiceKey.String() + " " + v.Scheduler
	if v.Flags&FlagPersistent != 0 {
		s += fmt.Sprintf(" persistent %d", v.Timeout)
	}
	if f := v.Flags &^ FlagPersistent; f != 0 {
		s += fmt.Sprintf(" flags %#x", f)
	}
	return s
}

// RealServer is an IPVS destination of a virtual server. vipproxy uses
// masquerading (NAT) forwarding only.
type RealServer struct {
	Addr   netip.Addr
	Port   uint16
	Weight int
	// ActiveConn and InactiveConn are read from the kernel and ignored
	// when writing.
	ActiveConn   int
	InactiveConn int
}

// AddrPort returns the real server's address and port.
func (r RealServer) AddrPort() netip.AddrPort { return netip.AddrPortFrom(r.Addr, r.Port) }

func (r RealServer) String() string {
	return fmt.Sprintf("%s w%d", r.AddrPort(), r.Weight)
}

// Timeouts are the IPVS connection timeouts; a zero field is left as is.
type Timeouts struct {
	TCP, TCPFin, UDP time.Duration
}

// Kernel is the OS boundary of the IPVS mode: the IPVS netlink family of
// the current network namespace. Implementations: Netlink (Linux) and Fake.
type Kernel interface {
	// Services lists every virtual server (vipproxy's and others').
	Services() ([]VirtualServer, error)
	// AddService creates a virtual server; an existing one is an error for
	// which IsExist is true.
	AddService(vs VirtualServer) error
	// UpdateService changes scheduler, flags and timeout of an existing
	// virtual server; a missing one is an error for which IsNotFound is true.
	UpdateService(vs VirtualServer) error
	// DelService deletes a virtual server and its real servers; a missing
	// one is an error for which IsNotFound is true.
	DelService(k ServiceKey) error
	// Destinations lists the real servers of a virtual server, with their
	// connection counts.
	Destinations(k ServiceKey) ([]RealServer, error)
	// AddDest adds a real server; an existing one is an IsExist error.
	AddDest(k ServiceKey, rs RealServer) error
	// UpdateDest changes a real server's weight.
	UpdateDest(k ServiceKey, rs RealServer) error
	// DelDest deletes a real server; a missing one is an IsNotFound error.
	DelDest(k ServiceKey, rs RealServer) error
	// SetTimeouts sets the IPVS tcp, tcpfin and udp timeouts (zero fields
	// unchanged).
	SetTimeouts(t Timeouts) error
}

// ErrExist and ErrNotFound are what IsExist and IsNotFound look for.
var (
	ErrExist    = errors.New("ipvs: already exists")
	ErrNotFound = errors.New("ipvs: not found")
)

// IsExist reports whether err says the object already exists.
func IsExist(err error) bool { return errors.Is(err, ErrExist) }

// IsNotFound reports whether err says the object does not exist.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// validScheduler reports whether name is one of Schedulers.
func validScheduler(name string) bool {
	for _, s := range Schedulers {
		if s == name {
			return true
		}
	}
	return false
}
