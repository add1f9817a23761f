package convert

// Tests of address and prefix parsing (addr.go).

import (
	"testing"
)

func TestParseAddr(t *testing.T) {
	tests := []struct {
		in, want string // want "" = error
	}{
		{"10.96.0.10", "10.96.0.10"},
		{"010.096.000.010", "10.96.0.10"},
		{"2001:DB8::1", "2001:db8::1"},
		{"2001:0db8:0000::0001", "2001:db8::1"},
		{"::ffff:10.1.2.3", "10.1.2.3"},
		{"127.0.0.1", "127.0.0.1"},
		{"256.0.0.1", ""},
		{"1.2.3", ""},
		{"1.2.3.4.5", ""},
		{"1..2.3", ""},
		{"-1.2.3.4", ""},
		{" 1.2.3.4", ""},
		{"0x1.2.3.4", ""},
		{"fe80::1%eth0", ""},
		{"", ""},
		{"::g", ""},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			a, err := parseAddr(tc.in)
			switch {
			case tc.want == "" && err == nil:
				t.Errorf("parseAddr(%q) = %v, want error", tc.in, a)
			case tc.want != "" && err != nil:
				t.Errorf("parseAddr(%q): %v", tc.in, err)
			case tc.want != "" && a.String() != tc.want:
				t.Errorf("parseAddr(%q) = %v, want %s", tc.in, a, tc.want)
			}
		})
	}
}

func TestParsePrefix(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"10.0.0.1/8", "10.0.0.0/8"},
		{"010.001.0.0/16", "10.1.0.0/16"},
		{"2001:DB8::/32", "2001:db8::/32"},
		{"0.0.0.0/0", "0.0.0.0/0"},
		{"10.0.0.0/33", ""},
		{"10.0.0.0", ""},
		{"10.0.0.0/", ""},
		{"10.0.0.0/-1", ""},
		{"::ffff:10.0.0.0/104", "10.0.0.0/8"},
		{"fd00::/129", ""},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			p, err := parsePrefix(tc.in)
			switch {
			case tc.want == "" && err == nil:
				t.Errorf("parsePrefix(%q) = %v, want error", tc.in, p)
			case tc.want != "" && err != nil:
				t.Errorf("parsePrefix(%q): %v", tc.in, err)
			case tc.want != "" && p.String() != tc.want:
				t.Errorf("parsePrefix(%q) = %v, want %s", tc.in, p, tc.want)
			}
		})
	}
}
