//go:build linux

package k8s

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/vipproxy/vipproxy/internal/config"
)

// deployObjects decodes every document of deploy/<file>.
func (c *cluster) deployObjects(t testing.TB, file string) []runtime.Object {
	t.Helper()
	return deployObjects(t, c.root, file)
}

// deployObjects decodes every document of <root>/deploy/<file>.
func deployObjects(t testing.TB, root, file string) []runtime.Object {
	t.Helper()
	path := filepath.Join(root, "deploy", file)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeAll(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(objs) == 0 {
		t.Fatalf("%s: no objects", path)
	}
	return objs
}

// decodeAll decodes a multi-document YAML stream into typed objects.
func decodeAll(data []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []runtime.Object
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		out = append(out, obj)
	}
}

// createObject creates obj through the typed client, server-side dry-run
// only when dryRun is set. An object that exists already is not an error
// when dryRun is false (the bed may apply RBAC before the Deploy test).
func createObject(ctx context.Context, c kubernetes.Interface, obj runtime.Object, dryRun bool) error {
	opts := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var err error
	switch o := obj.(type) {
	case *corev1.ServiceAccount:
		_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
	case *corev1.ConfigMap:
		_, err = c.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, opts)
	case *rbacv1.ClusterRole:
		_, err = c.RbacV1().ClusterRoles().Create(ctx, o, opts)
	case *rbacv1.ClusterRoleBinding:
		_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
	case *appsv1.DaemonSet:
		_, err = c.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, opts)
	default:
		return fmt.Errorf("unexpected object %T in deploy/", obj)
	}
	if err != nil && !(apierrors.IsAlreadyExists(err) && !dryRun) {
		return fmt.Errorf("%T: %w", obj, err)
	}
	return nil
}

// testDeploy validates every manifest in deploy/ with a server-side
// dry-run (strict field validation, admission included) and checks that
// the RBAC grants vipproxy what it reads and nothing it does not.
func (c *cluster) testDeploy(t *testing.T) {
	ctx := context.Background()
	entries, err := os.ReadDir(filepath.Join(c.root, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, e := range entries {
		if filepath.Ext(e.Name()) != ".yaml" {
			continue
		}
		for _, obj := range c.deployObjects(t, e.Name()) {
			kind := fmt.Sprintf("%T", obj)
			kinds[kind] = true
			if err := createObject(ctx, c.admin, obj, true); err != nil {
				// RBAC objects exist already (the bed applied them).
				if !apierrors.IsAlreadyExists(errors.Unwrap(err)) {
					t.Errorf("%s: dry-run: %v", e.Name(), err)
				}
			}
		}
	}
	for _, k := range []string{"*v1.DaemonSet", "*v1.ConfigMap", "*v1.ServiceAccount", "*v1.ClusterRole", "*v1.ClusterRoleBinding"} {
		if !kinds[k] {
			t.Errorf("deploy/: no %s", k)
		}
	}
	// The dry-run DaemonSet must not have been stored.
	if _, err := c.admin.AppsV1().DaemonSets("kube-system").Get(ctx, "vipproxy", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("dry-run stored the DaemonSet (get: %v)", err)
	}
	// A broken manifest is refused by the same path, so the check can fail.
	bad := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "broken", Namespace: "kube-system"}}
	if err := createObject(ctx, c.admin, bad, true); err == nil {
		t.Error("dry-run accepted a DaemonSet without selector and containers")
	}

	checks := []struct {
		verb, group, resource, name string
		allowed                     bool
	}{
		{"list", "", "services", "", true},
		{"watch", "", "services", "", true},
		{"list", "discovery.k8s.io", "endpointslices", "", true},
		{"watch", "discovery.k8s.io", "endpointslices", "", true},
		{"get", "", "nodes", "node1", true},
		{"watch", "", "nodes", "", true},
		{"create", "", "events", "", true},
		{"create", "events.k8s.io", "events", "", true},
		{"list", "", "pods", "", false},
		{"list", "", "secrets", "", false},
		{"update", "", "services", "", false},
		{"create", "discovery.k8s.io", "endpointslices", "", false},
		{"update", "", "nodes", "node1", false},
	}
	for _, ck := range checks {
		sar := &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
			User:   ProxyUser,
			Groups: []string{"system:authenticated"},
			ResourceAttributes: &authv1.ResourceAttributes{Verb: ck.verb, Group: ck.group, Resource: ck.resource,
				Name: ck.name},
		}}
		got, err := c.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("subjectaccessreview: %v", err)
		}
		if got.Status.Allowed != ck.allowed {
			t.Errorf("vipproxy %s %s.%s: allowed=%v, want %v (%s)", ck.verb, ck.resource, ck.group,
				got.Status.Allowed, ck.allowed, got.Status.Reason)
		}
	}
}

// TestManifests checks deploy/ without a cluster (no root needed): every
// document decodes, the DaemonSet refers to the ServiceAccount and
// ConfigMap that exist, and the ConfigMap's KubeProxyConfiguration passes
// vipproxy's strict decoder.
func TestManifests(t *testing.T) {
	root := moduleRoot(t)
	var ds *appsv1.DaemonSet
	var cm *corev1.ConfigMap
	var sa *corev1.ServiceAccount
	var binding *rbacv1.ClusterRoleBinding
	for _, f := range []string{"rbac.yaml", "configmap.yaml", "daemonset.yaml"} {
		for _, obj := range deployObjects(t, root, f) {
			switch o := obj.(type) {
			case *appsv1.DaemonSet:
				ds = o
			case *corev1.ConfigMap:
				cm = o
			case *corev1.ServiceAccount:
				sa = o
			case *rbacv1.ClusterRoleBinding:
				binding = o
			}
		}
	}
	if ds == nil || cm == nil || sa == nil || binding == nil {
		t.Fatalf("deploy/: missing objects: daemonset %v configmap %v serviceaccount %v binding %v", ds != nil, cm != nil, sa != nil, binding != nil)
	}
	spec := ds.Spec.Template.Spec
	if spec.ServiceAccountName != sa.Name || ds.Namespace != sa.Namespace {
		t.Errorf("DaemonSet runs as %s/%s, ServiceAccount is %s/%s", ds.Namespace, spec.ServiceAccountName, sa.Namespace, sa.Name)
	}
	if len(binding.Subjects) != 1 || binding.Subjects[0].Name != sa.Name || binding.Subjects[0].Namespace != sa.Namespace {
		t.Errorf("ClusterRoleBinding subjects %+v, want ServiceAccount %s/%s", binding.Subjects, sa.Namespace, sa.Name)
	}
	if !spec.HostNetwork {
		t.Error("DaemonSet: hostNetwork is false")
	}
	// Scrape configs and dashboards select kube-proxy's pods by this label.
	if got := ds.Spec.Template.Labels["k8s-app"]; got != "kube-proxy" {
		t.Errorf("DaemonSet pods labelled k8s-app=%q, want kube-proxy (scrape configs select it)", got)
	}
	if ds.Spec.Selector == nil || ds.Spec.Selector.MatchLabels["k8s-app"] != "" {
		t.Errorf("DaemonSet selector %v must not use k8s-app, kube-proxy's DaemonSet selector", ds.Spec.Selector)
	}
	mounts := map[string]bool{}
	for _, v := range spec.Volumes {
		switch {
		case v.ConfigMap != nil && v.ConfigMap.Name == cm.Name:
			mounts["configmap"] = true
		case v.HostPath != nil:
			mounts[v.HostPath.Path] = true
		}
	}
	for _, want := range []string{"configmap", "/lib/modules", "/run/xtables.lock"} {
		if !mounts[want] {
			t.Errorf("DaemonSet: no volume for %s", want)
		}
	}
	// --state-dir (default) must be writable: no read-only mount at or
	// above it (the ConfigMap used to be mounted over it).
	for _, vm := range spec.Containers[0].VolumeMounts {
		if vm.ReadOnly && (config.DefaultStateDir == vm.MountPath || strings.HasPrefix(config.DefaultStateDir, strings.TrimSuffix(vm.MountPath, "/")+"/")) {
			t.Errorf("DaemonSet: read-only mount %s covers the state dir %s", vm.MountPath, config.DefaultStateDir)
		}
	}
	// A fresh node cannot reach the API server through the kubernetes
	// ClusterIP: the configuration must name a kubeconfig, held by the
	// ConfigMap, with a server address.
	kp, err := config.DecodeFile("config.conf", []byte(cm.Data["config.conf"]))
	if err != nil {
		t.Fatal(err)
	}
	if kc := kp.ClientConnection.Kubeconfig; kc == "" || !strings.Contains(cm.Data[filepath.Base(kc)], "server: https://") {
		t.Errorf("ConfigMap: clientConnection.kubeconfig %q is not a kubeconfig the ConfigMap holds", kc)
	}
	if c := spec.Containers; len(c) != 1 || c[0].SecurityContext == nil || c[0].SecurityContext.Privileged == nil || !*c[0].SecurityContext.Privileged {
		t.Error("DaemonSet: want one privileged container")
	}
	out := filepath.Join(t.TempDir(), "config.conf")
	if _, err := proxyConfigFile(filepath.Join(root, "deploy", "configmap.yaml"), out, "/dev/null"); err != nil {
		t.Fatal(err)
	}
	if _, err := config.LoadFile(out); err != nil {
		t.Errorf("rewritten config does not load: %v", err)
	}
}
