// Package healthcheck serves the proxier's /healthz and /livez with
// kube-proxy's semantics and bodies.
package healthcheck

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
)

// ProxierHealth tracks whether queued updates reach the dataplane in time.
//
// The proxier is healthy unless an update was queued and has not been
// applied within Timeout (kube-proxy uses 2 × syncPeriod). /healthz is also
// 503 until the first successful sync, so that a node whose proxy has
// programmed nothing yet (it cannot reach the API server, say) is not
// Ready, and while the Node is being deleted or carries the
// ToBeDeletedByClusterAutoscaler taint, so load balancers drain the node;
// /livez ignores both (a proxy still waiting for its first sync is alive,
// and restarting it would not help). The zero value is not usable: use NewProxierHealth.
type ProxierHealth struct {
	timeout time.Duration
	now     func() time.Time

	mu            sync.Mutex
	lastUpdated   time.Time
	synced        bool // a sync succeeded
	oldestPending time.Time
	nodeEligible  bool
}

// NewProxierHealth returns a tracker with the given timeout. now is the
// clock (nil means time.Now).
func NewProxierHealth(timeout time.Duration, now func() time.Time) *ProxierHealth {
	if now == nil {
		now = time.Now
	}
	return &ProxierHealth{timeout: timeout, now: now, nodeEligible: true}
}

// SetTimeout changes the timeout (config reload).
func (h *ProxierHealth) SetTimeout(d time.Duration) {
	h.mu.Lock()
	h.timeout = d
	h.mu.Unlock()
}

// QueuedUpdate records that a change is waiting to be programmed. Only the
// oldest pending change counts.
func (h *ProxierHealth) QueuedUpdate() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.oldestPending.IsZero() {
		h.oldestPending = h.now()
	}
}

// Updated records a successful sync: every pending change is applied.
func (h *ProxierHealth) Updated() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastUpdated = h.now()
	h.synced = true
	h.oldestPending = time.Time{}
}

// SyncNode updates node eligibility from this node (nil: eligible).
func (h *ProxierHealth) SyncNode(n *model.Node) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeEligible = n == nil || !(n.Deleting || n.ToBeDeleted)
}

// Status is a snapshot of the tracker, as the handlers report it.
type Status struct {
	// Healthy: no queued update is late (what /livez reports).
	Healthy bool
	// Synced: a sync has succeeded; /healthz needs it.
	Synced       bool
	NodeEligible bool
	LastUpdated  time.Time
	CurrentTime  time.Time
}

// Status returns the current health.
func (h *ProxierHealth) Status() Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	healthy := h.oldestPending.IsZero() || !now.After(h.oldestPending.Add(h.timeout))
	return Status{Healthy: healthy, Synced: h.synced, NodeEligible: h.nodeEligible, LastUpdated: h.lastUpdated, CurrentTime: now}
}

// body is kube-proxy's health JSON (pkg/proxy/healthcheck ProxyHealth):
// times in RFC 3339, the overall verdict, and one entry per IP family
// (vipproxy programs both in one sync, so they agree). lastUpdated is the
// current time when healthy, as kube-proxy reports it for compatibility
// with older releases.
type body struct {
	LastUpdated  time.Time               `json:"lastUpdated"`
	CurrentTime  time.Time               `json:"currentTime"`
	NodeEligible *bool                   `json:"nodeEligible,omitempty"`
	Healthy      bool                    `json:"healthy"`
	Status       map[string]familyHealth `json:"status,omitempty"`
}

type familyHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

func newBody(st Status, healthy bool, eligible *bool) body {
	b := body{LastUpdated: st.LastUpdated, CurrentTime: st.CurrentTime, NodeEligible: eligible, Healthy: healthy,
		Status: map[string]familyHealth{}}
	for _, fam := range []string{"IPv4", "IPv6"} {
		b.Status[fam] = familyHealth{LastUpdated: st.LastUpdated, Healthy: st.Healthy && st.Synced}
	}
	if healthy {
		b.LastUpdated = st.CurrentTime
	}
	return b
}

// Handler returns the mux serving /healthz and /livez.
func (h *ProxierHealth) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		st := h.Status()
		eligible := st.NodeEligible
		code := http.StatusOK
		if !st.Healthy || !st.Synced || !st.NodeEligible {
			code = http.StatusServiceUnavailable
		}
		metrics.HealthzTotal.WithLabelValues(strconv.Itoa(code)).Inc()
		write(w, code, newBody(st, code == http.StatusOK, &eligible))
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		st := h.Status()
		code := http.StatusOK
		if !st.Healthy {
			code = http.StatusServiceUnavailable
		}
		metrics.LivezTotal.WithLabelValues(strconv.Itoa(code)).Inc()
		write(w, code, newBody(st, code == http.StatusOK, nil))
	})
	return mux
}

func write(w http.ResponseWriter, code int, b body) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(b)
}
