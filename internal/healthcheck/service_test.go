package healthcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func lbPort(name string, hc uint16, eps ...model.Endpoint) *model.ServicePort {
	return &model.ServicePort{
		Name:                  model.ServicePortName{ServiceName: model.ServiceName{Namespace: "ns", Name: name}, Protocol: model.TCP},
		Type:                  model.TypeLoadBalancer,
		Port:                  80,
		NodePort:              30080,
		ExternalTrafficPolicy: model.PolicyLocal,
		HealthCheckNodePort:   hc,
		Endpoints:             eps,
	}
}

func ep(ip string, local, ready bool) model.Endpoint {
	return model.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, Local: local, Ready: ready, Serving: ready}
}

func get(t *testing.T, port uint16) (int, map[string]any, string) {
	t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		t.Fatalf("GET health check port %d: %v", port, err)
	}
	defer resp.Body.Close()
	var b map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header.Get("X-Load-Balancing-Endpoint-Weight")
}

func TestServiceHealth(t *testing.T) {
	port := freePort(t)
	s := &ServiceHealth{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}
	defer s.Close()
	ctx := context.Background()

	steps := []struct {
		name       string
		ports      []*model.ServicePort
		wantCode   int
		wantLocal  float64
		wantWeight string
	}{
		{"two local ready endpoints", []*model.ServicePort{lbPort("web", port, ep("10.0.0.1", true, true), ep("10.0.0.2", true, true), ep("10.0.1.1", false, true))}, 200, 2, "2"},
		{"remote and not-ready do not count", []*model.ServicePort{lbPort("web", port, ep("10.0.0.1", true, false), ep("10.0.1.1", false, true))}, 503, 0, "0"},
		{"endpoint back", []*model.ServicePort{lbPort("web", port, ep("10.0.0.1", true, true))}, 200, 1, "1"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			s.Sync(ctx, &model.State{Ports: st.ports})
			code, body, weight := get(t, port)
			if code != st.wantCode || body["localEndpoints"] != st.wantLocal || weight != st.wantWeight {
				t.Errorf("got %d %v weight %q, want %d localEndpoints=%v weight %q", code, body, weight, st.wantCode, st.wantLocal, st.wantWeight)
			}
			svc, _ := body["service"].(map[string]any)
			if svc["namespace"] != "ns" || svc["name"] != "web" || body["serviceProxyHealthy"] != true {
				t.Errorf("body %v lacks the service name or health", body)
			}
		})
	}

	t.Run("cluster policy gets no server; removal closes", func(t *testing.T) {
		p := lbPort("web", port, ep("10.0.0.1", true, true))
		p.ExternalTrafficPolicy = model.PolicyCluster
		s.Sync(ctx, &model.State{Ports: []*model.ServicePort{p}})
		if len(s.Ports()) != 0 {
			t.Fatalf("servers %v, want none", s.Ports())
		}
		if _, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
			t.Fatal("port still open after the Service stopped needing it")
		}
	})

	t.Run("port in use is reported, not fatal, and other services still served", func(t *testing.T) {
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		busyPort := uint16(busy.Addr().(*net.TCPAddr).Port)
		s.Sync(ctx, &model.State{Ports: []*model.ServicePort{
			lbPort("busy", busyPort, ep("10.0.0.1", true, true)),
			lbPort("web", port, ep("10.0.0.1", true, true)),
		}})
		got := s.Ports()
		if _, ok := got[busyPort]; ok {
			t.Errorf("busy port reported as served")
		}
		if code, _, _ := get(t, port); code != 200 {
			t.Errorf("other service's health check = %d, want 200", code)
		}
	})
}
