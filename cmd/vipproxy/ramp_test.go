package main

import (
	"net/netip"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

func slowPort(slow time.Duration, ips ...string) *model.ServicePort {
	sp := &model.ServicePort{Name: model.ServicePortName{ServiceName: model.ServiceName{Namespace: "default", Name: "web"}, Protocol: model.TCP},
		Protocol: model.TCP, Port: 80, SlowStart: slow}
	for _, ip := range ips {
		sp.Endpoints = append(sp.Endpoints, model.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, Ready: true})
	}
	sp.ClusterEndpoints = sp.Endpoints
	return sp
}

func weights(st *model.State) []int {
	var out []int
	for _, e := range st.Ports[0].ClusterEndpoints {
		out = append(out, e.W())
	}
	return out
}

// TestRamp: endpoints present at the first build keep their weight; one
// that joins later starts at a tenth and grows linearly to full weight;
// ports without slow start are passed through.
func TestRamp(t *testing.T) {
	now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	invalidated := 0
	r := newRamp(func() { invalidated++ })
	r.now = func() time.Time { return now }
	st := &model.State{Ports: []*model.ServicePort{slowPort(10*time.Second, "10.0.0.1", "10.0.0.2")}}
	if got := r.apply(st); got != st {
		t.Fatalf("first build changed: weights %v", weights(got))
	}
	st = &model.State{Ports: []*model.ServicePort{slowPort(10*time.Second, "10.0.0.1", "10.0.0.2", "10.0.0.3")}}
	for _, tc := range []struct {
		after time.Duration
		want  []int
	}{{0, []int{10, 10, 1}}, {time.Second, []int{10, 10, 1}}, {5 * time.Second, []int{10, 10, 5}}, {9 * time.Second, []int{10, 10, 9}}, {10 * time.Second, nil}} {
		now = time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC).Add(tc.after)
		got := r.apply(st)
		if tc.want == nil {
			if got != st {
				t.Errorf("after %v: still ramping, weights %v", tc.after, weights(got))
			}
			continue
		}
		if w := weights(got); len(w) != 3 || w[0] != tc.want[0] || w[1] != tc.want[1] || w[2] != tc.want[2] {
			t.Errorf("after %v: weights %v, want %v", tc.after, w, tc.want)
		}
		if weights(st)[2] != 1 {
			t.Fatal("apply changed its input")
		}
	}
	plain := &model.State{Ports: []*model.ServicePort{slowPort(0, "10.0.0.1", "10.0.0.9")}}
	if r.apply(plain) != plain {
		t.Error("a port without slow start was rewritten")
	}
}

// withUses sets st.Uses as Build would.
func withUses(st *model.State) *model.State {
	st.Uses = model.UsesOf(st.Ports)
	return st
}

// TestRampForgets: a port that loses slow start is forgotten, so that its
// endpoints ramp again when it gets it back (they join a new ramp); with
// States that count their slow-start ports (as built) and without.
func TestRampForgets(t *testing.T) {
	for _, counted := range []bool{false, true} {
		uses := func(st *model.State) *model.State {
			if counted {
				return withUses(st)
			}
			return st
		}
		now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
		r := newRamp(nil)
		r.now = func() time.Time { return now }
		slow := uses(&model.State{Ports: []*model.ServicePort{slowPort(10*time.Second, "10.0.0.1", "10.0.0.2")}})
		r.apply(slow)
		plain := uses(&model.State{Ports: []*model.ServicePort{slowPort(0, "10.0.0.1", "10.0.0.2")}})
		if r.apply(plain) != plain || r.apply(plain) != plain {
			t.Fatalf("counted=%v: a port without slow start was rewritten", counted)
		}
		if len(r.ports) != 0 {
			t.Errorf("counted=%v: %d ports remembered after slow start went, want none", counted, len(r.ports))
		}
		now = now.Add(time.Second)
		if got := r.apply(slow); got == slow || weights(got)[0] != 1 {
			t.Errorf("counted=%v: the port back with slow start does not ramp (weights %v)", counted, weights(got))
		}
	}
}
