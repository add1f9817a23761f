package ipset

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDestroy(t *testing.T) {
	defer func(r, p time.Duration) { InUseRetry, InUsePause = r, p }(InUseRetry, InUsePause)
	InUseRetry, InUsePause = 200*time.Millisecond, time.Millisecond
	vip := func(n string) bool { return strings.HasPrefix(n, "VIP-") }
	for _, tc := range []struct {
		name     string
		inUse    int // Restore calls that fail "in use" first
		other    error
		want     []string
		wantErr  bool
		wantLeft []string
	}{
		{name: "matching sets go, others stay", want: []string{"VIP-A", "VIP-B"}, wantLeft: []string{"KUBE-X"}},
		{name: "in use for a moment is waited out", inUse: 3, want: []string{"VIP-A", "VIP-B"}, wantLeft: []string{"KUBE-X"}},
		{name: "in use for good fails", inUse: 1 << 30, wantErr: true, wantLeft: []string{"KUBE-X", "VIP-A", "VIP-B"}},
		{name: "other errors are not retried", other: errors.New("boom"), wantErr: true, wantLeft: []string{"KUBE-X", "VIP-A", "VIP-B"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &Fake{}
			if err := f.Restore(context.Background(), []byte("create VIP-A hash:ip\ncreate VIP-B hash:ip\ncreate KUBE-X hash:ip\n")); err != nil {
				t.Fatal(err)
			}
			calls := 0
			f.Fail = func(string) error {
				calls++
				if tc.other != nil {
					return tc.other
				}
				if calls <= tc.inUse {
					return errors.New("ipset restore: Set cannot be destroyed: it is in use by a kernel component")
				}
				return nil
			}
			got, _, err := Destroy(context.Background(), f, vip)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && !slices.Equal(got, tc.want) {
				t.Errorf("destroyed %v, want %v", got, tc.want)
			}
			if left, _ := f.List(context.Background()); !slices.Equal(left, tc.wantLeft) {
				t.Errorf("left %v, want %v", left, tc.wantLeft)
			}
		})
	}
}
