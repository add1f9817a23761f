package model

import (
	"errors"
	"net/netip"
	"testing"
)

func TestParseAddr(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" means error
	}{
		{"10.96.0.10", "10.96.0.10"},
		{"010.096.000.010", "10.96.0.10"}, // leading zeros are decimal, not octal
		{"0177.0.0.01", "177.0.0.1"},
		{"000.000.000.000", "0.0.0.0"},
		{"255.255.255.255", "255.255.255.255"},
		{"2001:DB8::1", "2001:db8::1"},
		{"2001:0DB8:0000:0000:0000:0000:0000:0001", "2001:db8::1"},
		{"FE80::A", "fe80::a"},
		{"::", "::"},
		{"::ffff:1.2.3.4", "1.2.3.4"}, // IPv4-mapped becomes IPv4
		{"::FFFF:0a00:0001", "10.0.0.1"},
		{"::1.2.3.4", "::102:304"}, // IPv4-compatible (deprecated) stays IPv6
		{"", ""},
		{"256.0.0.1", ""},
		{"1.2.3", ""},
		{"1.2.3.4.5", ""},
		{"1..2.3", ""},
		{"0010.0.0.1", "10.0.0.1"}, // any number of digits, as ParseIPSloppy
		{"0256.0.0.1", ""},
		{" 1.2.3.4", ""},
		{"1.2.3.4 ", ""},
		{"1.2.3.-4", ""},
		{"0x1.2.3.4", ""},
		{"fe80::1%eth0", ""},
		{"1.2.3.4%eth0", ""},
		{"2001:db8::g", ""},
		{"::ffff:001.2.3.4", ""},
		{"[::1]", ""},
		{"1.2.3.4/32", ""},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseAddr(tc.in)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("ParseAddr(%q) = %v, want error", tc.in, got)
				}
				if !errors.Is(err, ErrBadAddress) {
					t.Errorf("error %v does not wrap ErrBadAddress", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseAddr(%q): %v", tc.in, err)
			}
			if got.String() != tc.want {
				t.Errorf("ParseAddr(%q) = %s, want %s", tc.in, got, tc.want)
			}
			if got != netip.MustParseAddr(tc.want) {
				t.Errorf("ParseAddr(%q) not equal to canonical %s (4in6 or zone left?)", tc.in, tc.want)
			}
		})
	}
}

func TestParsePrefix(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{"10.0.0.0/8", "10.0.0.0/8"},
		{"10.1.2.3/8", "10.0.0.0/8"}, // host bits masked, as ParseCIDRSloppy's IPNet
		{"010.096.000.000/12", "10.96.0.0/12"},
		{"192.168.1.1/32", "192.168.1.1/32"},
		{"0.0.0.0/0", "0.0.0.0/0"},
		{"2001:DB8::1/64", "2001:db8::/64"},
		{"::/0", "::/0"},
		{"::ffff:10.0.0.0/104", "10.0.0.0/8"},
		{"10.0.0.0/33", ""},
		{"2001:db8::/129", ""},
		{"::ffff:10.0.0.0/95", ""},
		{"10.0.0.0", ""},
		{"10.0.0.0/", ""},
		{"10.0.0.0/-1", ""},
		{"10.0.0.0/0008", ""},
		{"fe80::%eth0/64", ""},
		{"10.0.0/8", ""},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParsePrefix(tc.in)
			if tc.want == "" {
				if err == nil || !errors.Is(err, ErrBadAddress) {
					t.Fatalf("ParsePrefix(%q) = %v, %v; want ErrBadAddress", tc.in, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePrefix(%q): %v", tc.in, err)
			}
			if got != netip.MustParsePrefix(tc.want) {
				t.Errorf("ParsePrefix(%q) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

func TestCheckEndpointIP(t *testing.T) {
	tests := []struct {
		in   string
		want []error // sentinels the error must wrap; nil = accepted
	}{
		{"10.0.0.1", nil},
		{"192.0.2.1", nil},
		{"2001:db8::1", nil},
		{"fd00::1", nil},
		{"127.0.0.1", []error{ErrLoopback}},
		{"127.255.0.3", []error{ErrLoopback}},
		{"::1", []error{ErrLoopback}},
		{"::ffff:127.0.0.1", []error{ErrLoopback}},
		{"0.0.0.0", []error{ErrUnspecified}},
		{"::", []error{ErrUnspecified}},
		{"169.254.169.254", []error{ErrLinkLocal}},
		{"fe80::1", []error{ErrLinkLocal}},
		{"224.0.0.1", []error{ErrLinkLocal, ErrMulticast}},
		{"ff02::1", []error{ErrLinkLocal, ErrMulticast}},
		{"239.1.1.1", []error{ErrMulticast}},
		{"ff05::2", []error{ErrMulticast}},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			err := CheckEndpointIP(netip.MustParseAddr(tc.in))
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want %v", tc.want)
			}
			for _, s := range tc.want {
				if !errors.Is(err, s) {
					t.Errorf("error %v does not wrap %v", err, s)
				}
			}
		})
	}
	if err := CheckEndpointIP(netip.Addr{}); !errors.Is(err, ErrInvalidIP) {
		t.Errorf("zero Addr: %v", err)
	}
	if err := CheckEndpointIP(netip.MustParseAddr("fd00::1%eth0")); !errors.Is(err, ErrInvalidIP) {
		t.Errorf("zoned: %v", err)
	}
}

// TestParsedEndpointsInBuild: parsed spellings flow through Build
// canonically, and 127.0.0.1 is refused there.
func TestParsedEndpointsInBuild(t *testing.T) {
	mustParse := func(s string) netip.Addr {
		a, err := ParseAddr(s)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	svc := webService()
	svc.ClusterIPs = []netip.Addr{mustParse("010.096.000.010"), mustParse("FD00:96::A")}
	sl4 := webSlice("v4",
		SliceEndpoint{Address: mustParse("010.000.000.001"), Ready: true, Serving: true},
		SliceEndpoint{Address: mustParse("127.0.0.1"), Ready: true, Serving: true},
		SliceEndpoint{Address: mustParse("::ffff:10.0.0.2"), Ready: true, Serving: true},
	)
	sl6 := webSlice("v6", SliceEndpoint{Address: mustParse("2001:DB8::1"), Ready: true, Serving: true})
	sl6.AddressType = IPv6
	st := Build(&Snapshot{Services: Ptrs([]Service{svc}), Slices: Ptrs([]EndpointSlice{sl4, sl6})}, BuildOptions{})
	p := findPort(st, "default/web:http/TCP")
	if p == nil {
		t.Fatalf("port missing: %v", st.Problems)
	}
	if got, want := epStrings(p.Endpoints), []string{"10.0.0.1:8080", "10.0.0.2:8080", "[2001:db8::1]:8080"}; !equalNil(got, want) {
		t.Errorf("endpoints = %v, want %v", got, want)
	}
	if p.ClusterIPs[0].String() != "10.96.0.10" || p.ClusterIPs[1].String() != "fd00:96::a" {
		t.Errorf("clusterIPs = %v", p.ClusterIPs)
	}
	if !hasProblem(st, "EndpointSlice default/v4", "endpoints[1].addresses[0]") {
		t.Errorf("127.0.0.1 not reported: %v", st.Problems)
	}
}
