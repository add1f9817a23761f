package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

// ServiceHealth runs the healthCheckNodePort servers of LoadBalancer
// Services with externalTrafficPolicy Local: load balancers probe them to
// learn which nodes have local endpoints.
//
// Each server answers any path with 200 and
// {"service":{"namespace","name"},"localEndpoints":N,"serviceProxyHealthy":true}
// when N (the Service's local ready endpoints) > 0 and the proxier is
// healthy, 503 otherwise, and always the X-Load-Balancing-Endpoint-Weight
// header N. Servers open and close as Services come and go; a port that
// cannot be bound is logged and retried on the next Sync, never fatal.
type ServiceHealth struct {
	// Addrs are the addresses to listen on; empty means all addresses.
	Addrs []netip.Addr
	// Proxier, when set, makes servers report serviceProxyHealthy from it.
	Proxier *ProxierHealth
	// Logger receives bind failures; nil means slog.Default().
	Logger *slog.Logger
	// Listen opens listeners; nil means net.Listen (tests inject).
	Listen func(network, addr string) (net.Listener, error)

	mu      sync.Mutex
	servers map[uint16]*hcServer
}

type hcServer struct {
	name      model.ServiceName
	listeners []net.Listener
	srv       *http.Server
	local     int
}

// Ports returns the health-check ports currently served, for tests and logs.
func (s *ServiceHealth) Ports() map[uint16]model.ServiceName {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[uint16]model.ServiceName, len(s.servers))
	for p, srv := range s.servers {
		out[p] = srv.name
	}
	return out
}

// Sync opens, updates and closes servers to match st. It has the
// signature of a reconcile AfterSync hook.
func (s *ServiceHealth) Sync(_ context.Context, st *model.State) {
	type want struct {
		name  model.ServiceName
		local map[netip.Addr]bool
	}
	wanted := map[uint16]*want{}
	for _, p := range st.Ports {
		if p.HealthCheckNodePort == 0 || !p.ExternalPolicyLocal() {
			continue
		}
		w := wanted[p.HealthCheckNodePort]
		if w == nil {
			w = &want{name: p.Name.ServiceName, local: map[netip.Addr]bool{}}
			wanted[p.HealthCheckNodePort] = w
		}
		for _, e := range p.Endpoints {
			if e.Local && e.Ready {
				w.local[e.IP] = true
			}
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.servers == nil {
		s.servers = map[uint16]*hcServer{}
	}
	for port, srv := range s.servers {
		if w, ok := wanted[port]; !ok || w.name != srv.name {
			srv.close()
			delete(s.servers, port)
		}
	}
	for port, w := range wanted {
		if srv, ok := s.servers[port]; ok {
			srv.local = len(w.local)
			continue
		}
		srv, err := s.open(port, w.name)
		if err != nil {
			s.log().Error("cannot open health check node port; will retry", "service", w.name.String(), "port", port, "err", err)
			continue
		}
		srv.local = len(w.local)
		s.servers[port] = srv
	}
}

// SetAddrs changes the listen addresses; servers reopen on the next Sync.
func (s *ServiceHealth) SetAddrs(addrs []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Addrs = addrs
	for port, srv := range s.servers {
		srv.close()
		delete(s.servers, port)
	}
}

// Close stops every server.
func (s *ServiceHealth) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for port, srv := range s.servers {
		srv.close()
		delete(s.servers, port)
	}
}

func (s *ServiceHealth) log() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

func (s *ServiceHealth) open(port uint16, name model.ServiceName) (*hcServer, error) {
	listen := s.Listen
	if listen == nil {
		listen = net.Listen
	}
	addrs := []string{":" + strconv.Itoa(int(port))}
	if len(s.Addrs) > 0 {
		addrs = addrs[:0]
		for _, a := range s.Addrs {
			addrs = append(addrs, netip.AddrPortFrom(a, port).String())
		}
	}
	h := &hcServer{name: name}
	for _, a := range addrs {
		ln, err := listen("tcp", a)
		if err != nil {
			h.close()
			return nil, err
		}
		h.listeners = append(h.listeners, ln)
	}
	h.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		n := h.local
		s.mu.Unlock()
		healthy := s.Proxier == nil || s.Proxier.Status().Healthy
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(n))
		code := http.StatusOK
		if n == 0 || !healthy {
			code = http.StatusServiceUnavailable
		}
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]any{
			"service":             map[string]string{"namespace": name.Namespace, "name": name.Name},
			"localEndpoints":      n,
			"serviceProxyHealthy": healthy,
		})
	}), ReadHeaderTimeout: 5 * time.Second}
	for _, ln := range h.listeners {
		go func(ln net.Listener) {
			if err := h.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log().Error("health check node port server failed", "service", name.String(), "err", err)
			}
		}(ln)
	}
	return h, nil
}

func (h *hcServer) close() {
	if h.srv != nil {
		_ = h.srv.Close()
	}
	for _, ln := range h.listeners {
		_ = ln.Close()
	}
}
