package ipvs

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
)

// destroyKubeProxySets destroys kube-proxy's ipsets (KUBE-*) and returns
// their names and how long it waited for the kernel to let go of them
// (see ipset.Destroy). The caller removes kube-proxy's chains first (all of
// them: its ipvs mode's KUBE-IPVS-FILTER matches five sets).
func destroyKubeProxySets(ctx context.Context, set ipset.Runner) ([]string, time.Duration, error) {
	names, waited, err := ipset.Destroy(ctx, set, func(n string) bool { return strings.HasPrefix(n, "KUBE-") })
	if err != nil {
		return nil, waited, fmt.Errorf("ipvs: destroy kube-proxy's ipsets: %w", err)
	}
	return names, waited, nil
}
