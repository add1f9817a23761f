package kube

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/vipproxy/vipproxy/internal/model"
)

// TestServiceEvent: the Event reaches the API server as a POST to the
// Service's namespace, naming the Service, with type, reason, message and
// this node as its source.
func TestServiceEvent(t *testing.T) {
	var got corev1.Event
	var path, method string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path, method = r.URL.Path, r.Method
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &got); err != nil {
			t.Errorf("body %q: %v", b, err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(b)
	}))
	defer srv.Close()
	c, err := NewClient(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{Client: c, NodeName: "node1"})
	if err := s.ServiceEvent(context.Background(), model.ServiceName{Namespace: "shop", Name: "web"}, true, "EndpointEjected", "10.244.1.5:8080 ejected"); err != nil {
		t.Fatal(err)
	}
	if method != http.MethodPost || path != "/api/v1/namespaces/shop/events" {
		t.Errorf("request %s %s, want POST /api/v1/namespaces/shop/events", method, path)
	}
	obj := got.InvolvedObject
	if obj.Kind != "Service" || obj.Namespace != "shop" || obj.Name != "web" || got.Type != corev1.EventTypeWarning ||
		got.Reason != "EndpointEjected" || got.Message != "10.244.1.5:8080 ejected" || got.Source.Host != "node1" || got.Count != 1 {
		t.Errorf("event %+v", got)
	}
	if err := New(Options{Client: &Client{}}).ServiceEvent(context.Background(), model.ServiceName{}, false, "x", "y"); err == nil {
		t.Error("no event client: no error")
	}
}
