package ipset

import (
	"context"
	"strings"
	"testing"
)

func TestParseCount(t *testing.T) {
	for _, c := range []struct {
		name, out string
		n         int
		errHas    string
	}{
		{"header", "Name: VIP-HAIRPIN\nType: hash:ip,port,ip\nRevision: 5\nHeader: family inet hashsize 1024 maxelem 16777216 bucketsize 12 initval 0x1\nSize in memory: 472\nReferences: 2\nNumber of entries: 3\n", 3, ""},
		{"empty set", "Name: S\nNumber of entries: 0\n", 0, ""},
		{"no line", "Name: S\n", 0, "no \"Number of entries\""},
		{"not a number", "Number of entries: many\n", 0, "many"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, ok, err := parseCount("S", c.out)
			if c.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), c.errHas) {
					t.Fatalf("parseCount = %d, %v, %v; want an error with %q", n, ok, err, c.errHas)
				}
				return
			}
			if err != nil || !ok || n != c.n {
				t.Fatalf("parseCount = %d, %v, %v; want %d", n, ok, err, c.n)
			}
		})
	}
}

func TestFakeCount(t *testing.T) {
	ctx := context.Background()
	var f Fake
	if _, ok, err := f.Count(ctx, "S"); ok || err != nil {
		t.Fatalf("Count of a missing set: ok %v, %v", ok, err)
	}
	if err := f.Restore(ctx, []byte("create S hash:ip,port family inet\nadd S 10.0.0.1,tcp:80\nadd S 10.0.0.2,tcp:80\n")); err != nil {
		t.Fatal(err)
	}
	if n, ok, err := f.Count(ctx, "S"); n != 2 || !ok || err != nil {
		t.Fatalf("Count = %d, %v, %v; want 2", n, ok, err)
	}
}
