package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// kubeProxyEnv names the kube-proxy binary (hack/kubeproxy.sh); hack/test.sh
// sets it when it runs as root.
const kubeProxyEnv = "VIPPROXY_KUBEPROXY"

// TestScrapeAgainstKubeProxy runs kube-proxy (node1) and vipproxy (node2)
// against one control plane, in the same mode, with the same Services, and
// requires every kubeproxy_* and rest_client_* series kube-proxy exports
// (name and label keys) among vipproxy's: scrape configs, recording rules
// and dashboards built on kube-proxy keep working.
func TestScrapeAgainstKubeProxy(t *testing.T) {
	kp := os.Getenv(kubeProxyEnv)
	if kp == "" {
		t.Skipf("%s is not set (hack/kubeproxy.sh builds kube-proxy; hack/test.sh sets it as root)", kubeProxyEnv)
	}
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) {
			RequireRoot(t)
			bin := Binaries(t)
			topo := NewTopology(t, 2)
			cp := StartControlPlane(t, topo, bin)
			admin := cp.Client(t, cp.AdminKubeconfig)
			ctx := context.Background()
			for _, obj := range deployObjects(t, moduleRoot(t), "rbac.yaml") {
				if err := createObject(ctx, admin, obj, false); err != nil {
					t.Fatalf("apply deploy/rbac.yaml: %v", err)
				}
			}
			registerNodes(t, admin, topo.Nodes)
			// A ClusterIP Service and a LoadBalancer with externalTrafficPolicy
			// Local whose endpoint is on neither node (no local endpoints).
			svc := service("web", "")
			svc, err := admin.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// The EndpointSlice controller's trigger time: both proxies
			// measure network programming latency from it.
			triggered := func(es *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
				es.Annotations = map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": time.Now().UTC().Format(time.RFC3339Nano)}
				return es
			}
			webSlice, err := admin.DiscoveryV1().EndpointSlices("default").Create(ctx, triggered(slice(svc, "a", ep(topo.Pods()[0]))), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			lb := service("lb", "")
			lb.Spec.Type = corev1.ServiceTypeLoadBalancer
			lb.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			lb, err = admin.CoreV1().Services("default").Create(ctx, lb, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			remote := ep(topo.Pods()[len(topo.Pods())-1])
			remote.NodeName = ptrTo("elsewhere")
			if _, err := admin.DiscoveryV1().EndpointSlices("default").Create(ctx, slice(lb, "a", remote), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}

			kubeProxy := startKubeProxy(t, topo, topo.Nodes[0], kp, mode, cp.AdminKubeconfig)
			StartVipproxy(t, topo, topo.Nodes[1], e2e.Binary(t), ProxyOptions{Kubeconfig: cp.ProxyKubeconfig,
				ExtraArgs: []string{"--proxy-mode", mode}})
			if err := WaitHealth(kubeProxy, topo.Nodes[0], "/healthz", 200, 60*time.Second); err != nil {
				t.Fatal(err)
			}
			// One more change, after both synced, so that the change
			// metrics (pending, totals, programming latency) have values.
			svc.Spec.Ports[0].Port = 81
			if _, err := admin.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			webSlice.Endpoints = append(webSlice.Endpoints, ep(topo.Pods()[1]))
			if _, err := admin.DiscoveryV1().EndpointSlices("default").Update(ctx, triggered(webSlice), metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * time.Second)

			want, kpFams := series(t, topo.Nodes[0].NS)
			got, vpFams := series(t, topo.Nodes[1].NS)
			checkDashboard(t, mode, kpFams, vpFams)
			var missing []string
			for s := range want {
				if why, known := knownGaps[s]; known && !got[s] {
					t.Logf("known gap: %s: %s", s, why)
					continue
				}
				if !got[s] {
					missing = append(missing, s)
				}
			}
			slices.Sort(missing)
			t.Logf("kube-proxy %s exports %d kubeproxy_*/rest_client_* series; vipproxy %d", mode, len(want), len(got))
			if len(missing) > 0 {
				t.Errorf("series kube-proxy exports and vipproxy does not (name{label keys}):\n%s", strings.Join(missing, "\n"))
			}
		})
	}
}

// knownGaps are series vipproxy does not export yet, each with why; the
// test fails on any other.
var knownGaps = map[string]string{}

func ptrTo[T any](v T) *T { return &v }

// checkDashboard requires every metric that a panel of
// deploy/grafana-dashboard.json queries to be exported by both kube-proxy
// and vipproxy (panels described as "iptables mode only" are checked in
// iptables mode only): the dashboard works against both.
func checkDashboard(t *testing.T, mode string, kubeProxy, vipproxy map[string]bool) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title, Description string
			Targets            []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("deploy/grafana-dashboard.json: %v", err)
	}
	metric := regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{`)
	checked := 0
	for _, p := range dash.Panels {
		if strings.Contains(p.Description, "iptables mode only") && mode != "iptables" {
			continue
		}
		for _, tg := range p.Targets {
			for _, m := range metric.FindAllStringSubmatch(tg.Expr, -1) {
				name := m[1]
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if base, ok := strings.CutSuffix(name, suffix); ok && (kubeProxy[base] || vipproxy[base]) {
						name = base
					}
				}
				checked++
				if !kubeProxy[name] || !vipproxy[name] {
					t.Errorf("dashboard panel %q queries %s: kube-proxy has it %v, vipproxy %v", p.Title, name, kubeProxy[name], vipproxy[name])
				}
			}
		}
	}
	if checked < 10 {
		t.Errorf("only %d metric references found in the dashboard", checked)
	}
}

// series scrapes /metrics in ns and returns every kubeproxy_* and
// rest_client_* family as "name{sorted label keys}", and the names of all
// families.
func series(t *testing.T, ns string) (map[string]bool, map[string]bool) {
	t.Helper()
	_, body, err := e2e.HTTPGet(ns, MetricsAddr, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out, names := map[string]bool{}, map[string]bool{}
	for name, f := range fams {
		names[name] = true
		if !strings.HasPrefix(name, "kubeproxy_") && !strings.HasPrefix(name, "rest_client_") {
			continue
		}
		for _, m := range f.GetMetric() {
			var keys []string
			for _, l := range m.GetLabel() {
				keys = append(keys, l.GetName())
			}
			slices.Sort(keys)
			out[fmt.Sprintf("%s{%s}", name, strings.Join(keys, ","))] = true
		}
	}
	return out, names
}
