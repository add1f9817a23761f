package conntrack

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/sysctl"
)

func TestMaxFor(t *testing.T) {
	tests := []struct{ perCore, min, cpus, want int }{
		{32768, 131072, 2, 131072},
		{32768, 131072, 8, 262144},
		{0, 131072, 8, 0},
		{100, 0, 4, 400},
	}
	for _, tc := range tests {
		if got := MaxFor(tc.perCore, tc.min, tc.cpus); got != tc.want {
			t.Errorf("MaxFor(%d,%d,%d) = %d, want %d", tc.perCore, tc.min, tc.cpus, got, tc.want)
		}
	}
}

func TestApply(t *testing.T) {
	f := &sysctl.Fake{Values: map[string]string{
		procNF + "nf_conntrack_max": "65536",
		hashSize:                    "16384",
		procNF + "nf_conntrack_tcp_timeout_established": "432000",
		procNF + "nf_conntrack_tcp_timeout_close_wait":  "60",
		procNF + "nf_conntrack_tcp_be_liberal":          "0",
		procNF + "nf_conntrack_udp_timeout":             "30",
	}, ReadOnly: map[string]bool{procNF + "nf_conntrack_max": true}}
	set := &sysctl.Setter{FS: f, Journal: filepath.Join(t.TempDir(), "j.json")}
	err := Apply(set, Settings{
		Max:                   262144,
		TCPEstablishedTimeout: 24 * time.Hour,
		TCPCloseWaitTimeout:   time.Hour,
		TCPBeLiberal:          true,
		UDPTimeout:            30 * time.Second,
		UDPStreamTimeout:      2 * time.Minute, // parameter missing here
	})
	if err == nil || !IsWarning(err) {
		t.Fatalf("Apply = %v, want a warning for the read-only max and the missing udp stream timeout", err)
	}
	want := []string{ // no hash size: the limit itself was read-only
		procNF + "nf_conntrack_tcp_timeout_established=86400",
		procNF + "nf_conntrack_tcp_timeout_close_wait=3600",
		procNF + "nf_conntrack_tcp_be_liberal=1",
	}
	if !slices.Equal(f.Writes, want) {
		t.Errorf("writes\n%v\nwant\n%v", f.Writes, want)
	}
	if _, err := sysctl.Restore(f, set.Journal); err != nil {
		t.Fatal(err)
	}
	if f.Values[procNF+"nf_conntrack_tcp_be_liberal"] != "0" {
		t.Errorf("restore did not bring the originals back: %v", f.Values)
	}
}

func TestApplyRaisesHashSizeWithMax(t *testing.T) {
	f := &sysctl.Fake{Values: map[string]string{procNF + "nf_conntrack_max": "65536", hashSize: "16384"}}
	if err := Apply(&sysctl.Setter{FS: f}, Settings{Max: 262144}); err != nil {
		t.Fatal(err)
	}
	if want := []string{procNF + "nf_conntrack_max=262144", hashSize + "=65536"}; !slices.Equal(f.Writes, want) {
		t.Errorf("writes %v, want %v", f.Writes, want)
	}
}
