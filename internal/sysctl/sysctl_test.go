package sysctl

import (
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"testing"
)

func TestSetJournalsAndRestores(t *testing.T) {
	f := &Fake{Values: map[string]string{"/a": "1", "/b": "x", "/ro": "0"}, ReadOnly: map[string]bool{"/ro": true}}
	j := filepath.Join(t.TempDir(), "sysctl.json")
	s := &Setter{FS: f, Journal: j}

	steps := []struct {
		name        string
		path, value string
		wantChanged bool
		wantErr     error
	}{
		{"change records original", "/a", "2", true, nil},
		{"second change keeps first original", "/a", "3", true, nil},
		{"same value writes nothing", "/b", "x", false, nil},
		{"missing is ErrNotExist", "/missing", "1", false, fs.ErrNotExist},
		{"read-only is ErrPermission", "/ro", "1", false, fs.ErrPermission},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			changed, err := s.Set(st.path, st.value)
			if changed != st.wantChanged || !errors.Is(err, st.wantErr) {
				t.Fatalf("Set(%s,%s) = %v, %v; want %v, %v", st.path, st.value, changed, err, st.wantChanged, st.wantErr)
			}
		})
	}
	if want := []string{"/a=2", "/a=3"}; !slices.Equal(f.Writes, want) {
		t.Errorf("writes %v, want %v", f.Writes, want)
	}
	restored, err := Restore(f, j)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(restored, []string{"/a"}) {
		t.Errorf("restored %v", restored)
	}
	if f.Values["/a"] != "1" {
		t.Errorf("/a = %s after restore, want the original 1", f.Values["/a"])
	}
	if again, err := Restore(f, j); err != nil || len(again) != 0 {
		t.Errorf("second restore = %v, %v; want nothing left to restore", again, err)
	}
}

func TestRestoreWithoutJournal(t *testing.T) {
	restored, err := Restore(&Fake{}, filepath.Join(t.TempDir(), "none.json"))
	if err != nil || len(restored) != 0 {
		t.Fatalf("Restore without journal = %v, %v", restored, err)
	}
}

// TestJournaled: a write through Journaled journals the original once, a
// write of the value already there does nothing, and Restore puts the
// original back.
func TestJournaled(t *testing.T) {
	const p = "/proc/sys/net/ipv4/vs/conntrack"
	f := &Fake{Values: map[string]string{p: "0"}}
	journal := filepath.Join(t.TempDir(), "j.json")
	var jfs FS = Journaled{&Setter{FS: f, Journal: journal}}
	for _, v := range []string{"1", "1", "2"} {
		if err := jfs.Write(p, v); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := jfs.Read(p); got != "2" {
		t.Errorf("read %q, want 2", got)
	}
	if want := []string{p + "=1", p + "=2"}; !slices.Equal(f.Writes, want) {
		t.Errorf("writes %v, want %v (no write of the value already there)", f.Writes, want)
	}
	if _, err := Restore(f, journal); err != nil {
		t.Fatal(err)
	}
	if f.Values[p] != "0" {
		t.Errorf("after Restore: %q, want the original 0", f.Values[p])
	}
}
