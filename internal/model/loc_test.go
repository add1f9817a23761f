package model

import (
	"slices"
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
	if s := unsafe.Sizeof(SliceEndpoint{}); s != 40 {
		t.Errorf("SliceEndpoint is %d bytes, want 40", s)
	}
	if s := unsafe.Sizeof(Endpoint{}); s != 40 {
		t.Errorf("Endpoint is %d bytes, want 40", s)
	}
	if s := unsafe.Sizeof(Service{}); s != 320 {
		t.Errorf("Service is %d bytes, want 320 (a size class)", s)
	}
}

// TestLocHints: hints are part of a Loc's value, read back as given, and
// asked about without allocating.
func TestLocHints(t *testing.T) {
	at := At("n1", "z1")
	for _, tc := range []struct {
		name         string
		zones, nodes []string
	}{
		{"none", nil, nil},
		{"zone", []string{"z1"}, nil},
		{"node", nil, []string{"n1"}},
		{"both", []string{"z1", "z2"}, []string{"n1", "n2", "n3"}},
		{"empty name", []string{""}, nil},
		// Names from a manifest may hold any byte.
		{"odd names", []string{"z1\x00z2", "", "z2"}, []string{"\x00", "n" + string(make([]byte, 200))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := at.WithHints(tc.zones, tc.nodes)
			if l.Locality() != at.Locality() {
				t.Errorf("hints changed the locality: %+v", l.Locality())
			}
			if got := l.ZoneHints(); !slices.Equal(got, tc.zones) {
				t.Errorf("ZoneHints = %q, want %q", got, tc.zones)
			}
			if got := l.NodeHints(); !slices.Equal(got, tc.nodes) {
				t.Errorf("NodeHints = %q, want %q", got, tc.nodes)
			}
			if l.hasZoneHints() != (len(tc.zones) > 0) || l.hasNodeHints() != (len(tc.nodes) > 0) {
				t.Errorf("has hints: zones %v nodes %v", l.hasZoneHints(), l.hasNodeHints())
			}
			for _, z := range []string{"z1", "z2", "z3", "", "z1\x00z2"} {
				if got, want := l.zoneHinted(z), slices.Contains(tc.zones, z); got != want {
					t.Errorf("zoneHinted(%q) = %v, want %v", z, got, want)
				}
			}
			for _, n := range []string{"n1", "n3", "n", "\x00"} {
				if got, want := l.nodeHinted(n), slices.Contains(tc.nodes, n); got != want {
					t.Errorf("nodeHinted(%q) = %v, want %v", n, got, want)
				}
			}
			if again := At("n1", "z1").WithHints(slices.Clone(tc.zones), slices.Clone(tc.nodes)); again != l {
				t.Error("the same hints give another Loc")
			}
			if len(tc.zones)+len(tc.nodes) > 0 && l == at {
				t.Error("hints do not change the Loc")
			}
			if n := testing.AllocsPerRun(10, func() { _ = l.zoneHinted("z2") || l.nodeHinted("n2") }); n != 0 {
				t.Errorf("asking about a hint allocates %v times", n)
			}
		})
	}
	if At("", "").WithHints(nil, nil) != (Loc{}) {
		t.Error("no locality and no hints is not the zero Loc")
	}
	if at.withHint("z1", "n1") != at.WithHints([]string{"z1"}, []string{"n1"}) {
		t.Error("withHint and WithHints disagree")
	}
}
