package ipvs

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

func TestTemplateOf(t *testing.T) {
	// 10.96.0.20:80 (0A600014 0050) → endpoints 10.244.1.5:8080 and
	// 10.244.2.6:8080 (0AF40105 / 0AF40206, 1F90); client 10.0.0.7 (0A000007).
	const table = `Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData
TCP 0A000007 D431 0A600014 0050 0AF40105 1F90 ESTABLISHED     899
TCP 0A000007 0000 0A600014 0050 0AF40206 1F90 NONE          10787
TCP 0A000007 0000 0A600099 0050 0AF40105 1F90 NONE          10799
TCP 0A000008 0000 0A600014 0050 0AF40105 1F90 NONE            120
TCP fd00::7 0000 fd96::20 0050 fd44::5 1F90 NONE             50
`
	sp := &model.ServicePort{
		Port: 80, AffinityTimeoutSeconds: 10800,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20"), netip.MustParseAddr("fd96::20")},
		ClusterEndpoints: []model.Endpoint{
			{IP: netip.MustParseAddr("10.244.1.5"), Port: 8080},
			{IP: netip.MustParseAddr("10.244.2.6"), Port: 8080},
			{IP: netip.MustParseAddr("fd44::5"), Port: 8080},
		},
	}
	for _, c := range []struct {
		client string
		want   string
		left   time.Duration
	}{
		{"10.0.0.7", "10.244.2.6:8080", 10787 * time.Second}, // not the connection, not another VIP's template
		{"10.0.0.8", "10.244.1.5:8080", 120 * time.Second},
		{"fd00::7", "[fd44::5]:8080", 50 * time.Second},
		{"10.0.0.9", "", 0},
	} {
		e, ok, err := templateOf(strings.NewReader(table), sp, netip.MustParseAddr(c.client))
		if err != nil {
			t.Fatalf("%s: %v", c.client, err)
		}
		if got := ""; ok {
			got = e.Endpoint.String()
			if got != c.want || e.Expires != c.left {
				t.Errorf("%s: %s, %v left; want %s, %v", c.client, got, e.Expires, c.want, c.left)
			}
		} else if c.want != "" {
			t.Errorf("%s: no template, want %s", c.client, c.want)
		}
	}
	if _, _, err := templateOf(strings.NewReader("TCP zz 0000 0A600014 0050 0AF40206 1F90 NONE 1\n"), sp, netip.MustParseAddr("10.0.0.7")); err == nil {
		t.Error("a malformed line: no error")
	}
}
