package healthcheck

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestProxierHealth(t *testing.T) {
	type step struct {
		advance time.Duration
		do      func(h *ProxierHealth)
	}
	queued := func(h *ProxierHealth) { h.QueuedUpdate() }
	updated := func(h *ProxierHealth) { h.Updated() }
	tests := []struct {
		name        string
		steps       []step
		wantHealthz int
		wantLivez   int
	}{
		{"fresh, never synced: not ready, alive", nil, 503, 200},
		{"first sync done", []step{{0, updated}}, 200, 200},
		{"never synced, queued and late", []step{{0, queued}, {61 * time.Second, nil}}, 503, 503},
		{"queued, not late", []step{{0, updated}, {0, queued}, {59 * time.Second, nil}}, 200, 200},
		{"queued and late", []step{{0, updated}, {0, queued}, {61 * time.Second, nil}}, 503, 503},
		{"late then updated", []step{{0, updated}, {0, queued}, {61 * time.Second, updated}}, 200, 200},
		{"oldest pending counts", []step{{0, updated}, {0, queued}, {50 * time.Second, queued}, {11 * time.Second, nil}}, 503, 503},
		{"updated resets pending", []step{{0, updated}, {0, queued}, {30 * time.Second, updated}, {0, queued}, {59 * time.Second, nil}}, 200, 200},
		{"node deleting: healthz only", []step{{0, updated}, {0, func(h *ProxierHealth) { h.SyncNode(&model.Node{Deleting: true}) }}}, 503, 200},
		{"autoscaler taint: healthz only", []step{{0, updated}, {0, func(h *ProxierHealth) { h.SyncNode(&model.Node{ToBeDeleted: true}) }}}, 503, 200},
		{"node back to eligible", []step{{0, updated}, {0, func(h *ProxierHealth) { h.SyncNode(&model.Node{ToBeDeleted: true}) }}, {0, func(h *ProxierHealth) { h.SyncNode(&model.Node{}) }}}, 200, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			h := NewProxierHealth(60*time.Second, c.now)
			for _, s := range tc.steps {
				c.t = c.t.Add(s.advance)
				if s.do != nil {
					s.do(h)
				}
			}
			srv := h.Handler()
			for path, want := range map[string]int{"/healthz": tc.wantHealthz, "/livez": tc.wantLivez} {
				rec := httptest.NewRecorder()
				srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				if rec.Code != want {
					t.Errorf("%s = %d, want %d (body %s)", path, rec.Code, want, rec.Body)
				}
				var b map[string]any
				if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
					t.Fatalf("%s body not JSON: %v", path, err)
				}
				if _, ok := b["currentTime"]; !ok {
					t.Errorf("%s body lacks currentTime: %v", path, b)
				}
				_, hasEligible := b["nodeEligible"]
				if hasEligible != (path == "/healthz") {
					t.Errorf("%s nodeEligible present=%v", path, hasEligible)
				}
				// kube-proxy's shape: RFC 3339 times, the verdict, per-family status.
				for _, k := range []string{"lastUpdated", "currentTime"} {
					if v, ok := b[k].(string); !ok {
						t.Errorf("%s %s = %v, want an RFC 3339 string", path, k, b[k])
					} else if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
						t.Errorf("%s %s %q: %v", path, k, v, err)
					}
				}
				if h, ok := b["healthy"].(bool); !ok || h != (rec.Code == http.StatusOK) {
					t.Errorf("%s healthy = %v with code %d", path, b["healthy"], rec.Code)
				}
				if st, ok := b["status"].(map[string]any); !ok || st["IPv4"] == nil || st["IPv6"] == nil {
					t.Errorf("%s status = %v, want IPv4 and IPv6 entries", path, b["status"])
				}
			}
		})
	}
}
