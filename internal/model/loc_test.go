package model

import (
	"testing"
	"unsafe"
)

func TestLoc(t *testing.T) {
	for _, tc := range []struct {
		node, zone string
	}{{"", ""}, {"n1", ""}, {"", "z1"}, {"n1", "z1"}} {
		l := At(tc.node, tc.zone)
		if got := l.Locality(); got != (Locality{tc.node, tc.zone}) {
			t.Errorf("At(%q, %q).Locality() = %+v", tc.node, tc.zone, got)
		}
		// Built from other strings of the same content: the same Loc.
		if again := At(string([]byte(tc.node)), string([]byte(tc.zone))); again != l || !again.Equal(l) {
			t.Errorf("At(%q, %q) twice differs", tc.node, tc.zone)
		}
		e := Endpoint{Loc: l}
		if e.NodeName() != tc.node || e.Zone() != tc.zone {
			t.Errorf("Endpoint at %q/%q reads %q/%q", tc.node, tc.zone, e.NodeName(), e.Zone())
		}
	}
	if At("", "") != (Loc{}) {
		t.Error("the empty locality is not the zero Loc")
	}
	if At("n1", "z1") == At("n1", "z2") || At("n1", "") == At("", "n1") {
		t.Error("different localities share a Loc")
	}
	// The sizes the 100,000s of endpoints are laid out for.
	if s := unsafe.Sizeof(SliceEndpoint{}); s != 48 {
		t.Errorf("SliceEndpoint is %d bytes, want 48", s)
	}
	if s := unsafe.Sizeof(Endpoint{}); s != 48 {
		t.Errorf("Endpoint is %d bytes, want 48", s)
	}
}
