//go:build linux

package k8s

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// imageEnv names the OCI archive hack/image.sh prints; hack/test.sh sets it
// when it runs as root.
const imageEnv = "VIPPROXY_IMAGE"

// kubeadmDaemonSet is kubeadm v1.34's kube-proxy DaemonSet
// (cmd/kubeadm/app/phases/addons/proxy/manifests.go, DaemonSet19) as it
// renders it, with only the image changed: the one-line swap an operator
// makes.
const kubeadmDaemonSet = `
apiVersion: apps/v1
kind: DaemonSet
metadata:
  labels:
    k8s-app: kube-proxy
  name: kube-proxy
  namespace: kube-system
spec:
  selector:
    matchLabels:
      k8s-app: kube-proxy
  updateStrategy:
    type: RollingUpdate
  template:
    metadata:
      labels:
        k8s-app: kube-proxy
    spec:
      priorityClassName: system-node-critical
      containers:
      - name: kube-proxy
        image: IMAGE
        imagePullPolicy: IfNotPresent
        command:
        - /usr/local/bin/kube-proxy
        - --config=/var/lib/kube-proxy/config.conf
        - --hostname-override=$(NODE_NAME)
        securityContext:
          privileged: true
        volumeMounts:
        - mountPath: /var/lib/kube-proxy
          name: kube-proxy
        - mountPath: /run/xtables.lock
          name: xtables-lock
          readOnly: false
        - mountPath: /lib/modules
          name: lib-modules
          readOnly: true
        env:
          - name: NODE_NAME
            valueFrom:
              fieldRef:
                fieldPath: spec.nodeName
      hostNetwork: true
      serviceAccountName: kube-proxy
      volumes:
      - name: kube-proxy
        configMap:
          name: kube-proxy
      - name: xtables-lock
        hostPath:
          path: /run/xtables.lock
          type: FileOrCreate
      - name: lib-modules
        hostPath:
          path: /lib/modules
      tolerations:
      - operator: Exists
      nodeSelector:
        kubernetes.io/os: linux
`

// kubeadmKubeconfig is the kubeconfig.conf key of kubeadm's kube-proxy
// ConfigMap (KubeProxyConfigMap19): the API server's own address and the
// Pod's ServiceAccount token and CA.
const kubeadmKubeconfig = `apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
    server: SERVER
  name: default
contexts:
- context:
    cluster: default
    namespace: default
    user: default
  name: default
current-context: default
users:
- name: default
  user:
    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
`

// kubeadmProxyConfig is config.conf as kubeadm writes it: the
// KubeProxyConfiguration with only bindAddress, clusterCIDR and the
// kubeconfig path set, marshalled without defaulting (so every zero value
// is written out: qps: 0, mode: "", configSyncPeriod: 0s, ...).
func kubeadmProxyConfig(t testing.TB, mode string) string {
	t.Helper()
	kp := kpv1alpha1.KubeProxyConfiguration{
		TypeMeta:    metav1.TypeMeta{APIVersion: "kubeproxy.config.k8s.io/v1alpha1", Kind: "KubeProxyConfiguration"},
		BindAddress: "0.0.0.0",
		ClusterCIDR: ClusterCIDR,
		Mode:        kpv1alpha1.ProxyMode(mode),
	}
	kp.ClientConnection.Kubeconfig = "/var/lib/kube-proxy/kubeconfig.conf"
	b, err := yaml.Marshal(kp)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestKubeadmImageSwap is issue 14's promise end to end: the image built by
// hack/image.sh, run by a real OCI runtime (podman with runc) exactly as
// kubeadm's kube-proxy DaemonSet says (command, env, mounts, host network,
// privileged, the kube-proxy ServiceAccount with kubeadm's RBAC and
// ConfigMap), on a node namespace with no rules, against a real API server.
// No kubelet runs: the test is the kubelet, turning the stored DaemonSet's
// Pod template into the container's arguments. Services must work, first
// with kubeadm's mode "" (vipproxy's nftables), then after the operator
// sets mode: iptables and the Pod restarts (the image's iptables drives the
// node's kernel, and the nftables rules are removed).
func TestKubeadmImageSwap(t *testing.T) {
	archive := os.Getenv(imageEnv)
	if archive == "" {
		t.Skipf("%s is not set (hack/image.sh builds the image; hack/test.sh sets it as root)", imageEnv)
	}
	RequireRoot(t)
	pm := newPodman(t, archive)
	c := &cluster{Topology: NewTopology(t, 2), root: moduleRoot(t)}
	c.cp = StartControlPlane(t, c.Topology, Binaries(t))
	c.admin = c.cp.Client(t, c.cp.AdminKubeconfig)
	ctx := context.Background()
	registerNodes(t, c.admin, c.Nodes)

	// kubeadm's objects: ServiceAccount, the binding to the API server's
	// bootstrap ClusterRole system:node-proxier, the ConfigMap and the
	// DaemonSet with the image swapped.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy", Namespace: "kube-system"}}
	if _, err := c.admin.CoreV1().ServiceAccounts("kube-system").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:node-proxier"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:node-proxier"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "kube-proxy", Namespace: "kube-system"}},
	}
	if _, err := c.admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	server := fmt.Sprintf("https://%s:%d", ControlIP, APIPort)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy", Namespace: "kube-system", Labels: map[string]string{"app": "kube-proxy"}},
		Data: map[string]string{
			"kubeconfig.conf": strings.Replace(kubeadmKubeconfig, "SERVER", server, 1),
			"config.conf":     kubeadmProxyConfig(t, ""),
		},
	}
	if _, err := c.admin.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict([]byte(strings.Replace(kubeadmDaemonSet, "IMAGE", pm.image, 1)), &ds); err != nil {
		t.Fatal(err)
	}
	if _, err := c.admin.AppsV1().DaemonSets("kube-system").Create(ctx, &ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	node := c.node(1) // the client routes Service ranges through node1
	if out, err := nsRun(node.NS, "nft", "list", "ruleset"); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("node1 is not a fresh node: %q %v", out, err)
	}
	svc := c.createService(t, service("web", ""))
	np := service("np", "")
	np.Spec.Type = corev1.ServiceTypeNodePort
	npSvc := c.createService(t, np)
	eps, names := c.allPods()
	c.createSlice(t, slice(svc, "a", eps...))
	c.createSlice(t, slice(npSvc, "a", eps...))
	check := func(t *testing.T) {
		c.waitFor(t, "tcp", hostPort(svc.Spec.ClusterIP, 80), settle, from(names...))
		c.waitFor(t, "udp", hostPort(svc.Spec.ClusterIP, 53), settle, from(names...))
		c.waitFor(t, "tcp", hostPort(node.IPv4, npSvc.Spec.Ports[0].NodePort), settle, from(names...))
		// The API server's own Service, reached through the rules the
		// image programmed.
		c.waitKubernetesService(t)
	}

	t.Run("mode-empty", func(t *testing.T) {
		pod := pm.runPod(t, c, &ds, node)
		if err := WaitHealth(nil, node, "/healthz", http.StatusOK, 90*time.Second); err != nil {
			t.Fatalf("%v\n%s", err, pod.logs())
		}
		c.waitForTCP(t, hostPort(svc.Spec.ClusterIP, 80), names, pod)
		check(t)
		logs := pod.logs()
		if !strings.Contains(logs, "proxy mode not set: running nftables mode") {
			t.Errorf("no warning about mode \"\" meaning nftables in the logs:\n%s", logs)
		}
		if out, _ := nsRun(node.NS, "nft", "list", "tables"); !strings.Contains(out, "vipproxy") {
			t.Errorf("no vipproxy nftables table on the node: %q", out)
		}
		pod.stop(t)
	})

	t.Run("mode-iptables", func(t *testing.T) {
		cur, err := c.admin.CoreV1().ConfigMaps("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Data["config.conf"] = kubeadmProxyConfig(t, "iptables")
		if _, err := c.admin.CoreV1().ConfigMaps("kube-system").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := pm.runPod(t, c, &ds, node)
		if err := WaitHealth(nil, node, "/healthz", http.StatusOK, 90*time.Second); err != nil {
			t.Fatalf("%v\n%s", err, pod.logs())
		}
		check(t)
		out, err := nsRun(node.NS, "iptables-nft-save", "-t", "nat")
		if err != nil || !strings.Contains(out, svc.Spec.ClusterIP) {
			t.Errorf("iptables mode: no nat rule for %s in iptables-nft-save (%v):\n%s", svc.Spec.ClusterIP, err, out)
		}
		if out, _ := nsRun(node.NS, "nft", "list", "tables"); strings.Contains(out, "table ip vipproxy") {
			t.Errorf("the nftables mode's table survived the switch to iptables mode: %q", out)
		}
		pod.stop(t)
	})

	// deploy/ on the other, fresh node: its kubeconfig.conf reaches the API
	// server by its own address (the in-cluster address would be the
	// kubernetes ClusterIP, which nothing has programmed there yet).
	t.Run("deploy-manifests", func(t *testing.T) {
		node := c.node(2)
		if out, err := nsRun(node.NS, "nft", "list", "ruleset"); err != nil || strings.TrimSpace(out) != "" {
			t.Fatalf("node2 is not a fresh node: %q %v", out, err)
		}
		var dds *appsv1.DaemonSet
		for _, f := range []string{"rbac.yaml", "configmap.yaml", "daemonset.yaml"} {
			for _, obj := range c.deployObjects(t, f) {
				switch o := obj.(type) {
				case *corev1.ConfigMap:
					for k, v := range o.Data {
						o.Data[k] = strings.ReplaceAll(v, "CONTROL_PLANE_ENDPOINT", ControlIP)
					}
				case *appsv1.DaemonSet:
					o.Spec.Template.Spec.Containers[0].Image = pm.image
					dds = o
				}
				if err := createObject(ctx, c.admin, obj, false); err != nil {
					t.Fatalf("apply deploy/%s: %v", f, err)
				}
			}
		}
		pod := pm.runPod(t, c, dds, node)
		if err := WaitHealth(nil, node, "/healthz", http.StatusOK, 90*time.Second); err != nil {
			t.Fatalf("%v\n%s", err, pod.logs())
		}
		c.waitFor(t, "tcp", hostPort(node.IPv4, npSvc.Spec.Ports[0].NodePort), settle, from(names...))
		r, err := e2e.DialWith(node.NS, "tcp", hostPort(svc.Spec.ClusterIP, 80), e2e.DialOptions{Timeout: time.Second})
		if err != nil || from(names...)(r) != nil {
			t.Errorf("ClusterIP from node2: %+v %v", r, err)
		}
		logs := pod.logs()
		if strings.Contains(logs, "no kubeconfig") {
			t.Errorf("deploy/ runs with the in-cluster config:\n%s", logs)
		}
		if strings.Contains(logs, "read-only file system") {
			t.Errorf("deploy/: the state dir is not writable:\n%s", logs)
		}
		pod.stop(t)
	})
}

// waitForTCP is waitFor with the pod's log in the failure message.
func (c *cluster) waitForTCP(t testing.TB, addr string, names []string, pod *podmanPod) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for time.Now().Before(deadline) {
		r, err := e2e.DialWith(c.Client, "tcp", addr, e2e.DialOptions{Timeout: 500 * time.Millisecond})
		if err == nil && from(names...)(r) == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("tcp %s: no answer from %v within %v\npod log:\n%s", addr, names, settle, pod.logs())
}

// podman runs containers with Debian's podman and runc, in a storage root
// of the test's own (vfs driver: no overlay mounts to leak), with the
// settings this machine needs: runc (crun refuses hybrid cgroups) and no
// default ulimits (setrlimit is not permitted).
type podman struct {
	dir   string
	image string // the loaded image's name
}

func newPodman(t *testing.T, archive string) *podman {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		t.Skip("podman is not installed (hack/deps.sh installs it as root)")
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "containers.conf")
	err := os.WriteFile(conf, []byte("[containers]\ndefault_ulimits = []\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n"), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	pm := &podman{dir: dir}
	out, err := pm.run("load", "-i", archive)
	if err != nil {
		t.Fatalf("podman load %s: %v\n%s", archive, err, out)
	}
	m := regexp.MustCompile(`Loaded image(?:\(s\))?: (\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("podman load: no image name in %q", out)
	}
	pm.image = "localhost/vipproxy:test"
	if out, err := pm.run("tag", m[1], pm.image); err != nil {
		t.Fatalf("podman tag: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		// Containers are removed by their own cleanups; this removes
		// the storage (image layers) the test made.
		if out, err := pm.run("system", "reset", "--force"); err != nil {
			t.Logf("podman system reset: %v\n%s", err, out)
		}
	})
	return pm
}

func (pm *podman) run(args ...string) (string, error) {
	argv := append([]string{"--root", filepath.Join(pm.dir, "root"), "--runroot", filepath.Join(pm.dir, "run"),
		"--storage-driver", "vfs"}, args...)
	cmd := exec.Command("podman", argv...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+filepath.Join(pm.dir, "containers.conf"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// podmanPod is one container started by runPod.
type podmanPod struct {
	pm   *podman
	name string
}

func (p *podmanPod) logs() string {
	out, _ := p.pm.run("logs", p.name)
	return out
}

// stop stops and removes the container (SIGTERM, then SIGKILL after 10 s),
// as the kubelet does when a Pod is deleted.
func (p *podmanPod) stop(t testing.TB) {
	if out, err := p.pm.run("rm", "--force", "--time", "10", p.name); err != nil {
		t.Errorf("podman rm %s: %v\n%s", p.name, err, out)
	}
}

// runPod does what a kubelet does for ds's Pod template on node, as far as
// vipproxy can tell: the container's command and args with $(VAR)
// expanded from its env (fieldRef spec.nodeName), ConfigMap volumes as
// read-only files, hostPath volumes (the node's root is a directory of the
// test's, but /lib/modules is the host's, read-only, where it exists), the ServiceAccount's
// token, CA and namespace at /var/run/secrets/kubernetes.io/serviceaccount,
// KUBERNETES_SERVICE_HOST/PORT, hostNetwork as the node's namespace and
// privileged. The container is removed when t ends.
func (pm *podman) runPod(t *testing.T, c *cluster, ds *appsv1.DaemonSet, node *e2e.Node) *podmanPod {
	t.Helper()
	ctx := context.Background()
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("DaemonSet %s: %d containers, want 1", ds.Name, len(spec.Containers))
	}
	ctr := spec.Containers[0]
	dir := t.TempDir()
	name := fmt.Sprintf("vpk8s-%s-%s-%d", c.ID, node.Name, time.Now().UnixNano()%1e6)
	args := []string{"run", "--detach", "--name", name, "--pull", "never",
		"--env", "KUBERNETES_SERVICE_HOST=" + kubernetesIP, "--env", "KUBERNETES_SERVICE_PORT=443"}
	if spec.HostNetwork {
		args = append(args, "--network", "ns:/run/netns/"+node.NS)
	}
	if sc := ctr.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
		args = append(args, "--privileged")
	}
	env := map[string]string{}
	for _, e := range ctr.Env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
				t.Fatalf("env %s: only fieldRef spec.nodeName is supported", e.Name)
			}
			v = node.Name
		}
		env[e.Name] = v
		args = append(args, "--env", e.Name+"="+v)
	}

	// The ServiceAccount's projected token, as the kubelet mounts it.
	tr, err := c.admin.CoreV1().ServiceAccounts(ds.Namespace).CreateToken(ctx, spec.ServiceAccountName,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ds.Namespace, spec.ServiceAccountName, err)
	}
	ca, err := os.ReadFile(c.cp.PKI.CACert)
	if err != nil {
		t.Fatal(err)
	}
	saDir := filepath.Join(dir, "serviceaccount")
	writeFiles(t, saDir, map[string]string{"token": tr.Status.Token, "ca.crt": string(ca), "namespace": ds.Namespace})
	args = append(args, "--volume", saDir+":/var/run/secrets/kubernetes.io/serviceaccount:ro")

	nodeRoot := filepath.Join(dir, "node-root")
	for _, vm := range ctr.VolumeMounts {
		var vol *corev1.Volume
		for i := range spec.Volumes {
			if spec.Volumes[i].Name == vm.Name {
				vol = &spec.Volumes[i]
			}
		}
		if vol == nil {
			t.Fatalf("volumeMount %s: no such volume", vm.Name)
		}
		var src string
		ro := vm.ReadOnly
		switch {
		case vol.ConfigMap != nil:
			cm, err := c.admin.CoreV1().ConfigMaps(ds.Namespace).Get(ctx, vol.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("volume %s: %v", vm.Name, err)
			}
			src, ro = filepath.Join(dir, "configmap-"+vm.Name), true // the kubelet mounts ConfigMaps read-only
			writeFiles(t, src, cm.Data)
		case vol.HostPath != nil && vol.HostPath.Path == "/lib/modules":
			// The host's modules where it has them (this kind of
			// machine has none: an empty directory stands in).
			src = "/lib/modules"
			if _, err := os.Stat(src); err != nil {
				src = filepath.Join(nodeRoot, "lib", "modules")
				if err := os.MkdirAll(src, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if !ro {
				t.Fatalf("volume %s: /lib/modules must be mounted read-only", vm.Name)
			}
		case vol.HostPath != nil:
			src = filepath.Join(nodeRoot, vol.HostPath.Path)
			typ := corev1.HostPathUnset
			if vol.HostPath.Type != nil {
				typ = *vol.HostPath.Type
			}
			switch typ {
			case corev1.HostPathFileOrCreate:
				writeFiles(t, filepath.Dir(src), map[string]string{filepath.Base(src): ""})
			case corev1.HostPathDirectoryOrCreate, corev1.HostPathUnset, corev1.HostPathDirectory:
				if err := os.MkdirAll(src, 0o755); err != nil {
					t.Fatal(err)
				}
			default:
				t.Fatalf("volume %s: hostPath type %s is not supported", vm.Name, typ)
			}
		default:
			t.Fatalf("volume %s: only configMap and hostPath are supported", vm.Name)
		}
		opt := ":rw"
		if ro {
			opt = ":ro"
		}
		args = append(args, "--volume", src+":"+vm.MountPath+opt)
	}
	expand := func(s string) string {
		return regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(s, func(m string) string {
			if v, ok := env[m[2:len(m)-1]]; ok {
				return v
			}
			return m
		})
	}
	if len(ctr.Command) > 0 {
		args = append(args, "--entrypoint", expand(ctr.Command[0]))
	}
	args = append(args, pm.image)
	for _, a := range append(append([]string{}, ctr.Command[min(1, len(ctr.Command)):]...), ctr.Args...) {
		args = append(args, expand(a))
	}
	pod := &podmanPod{pm: pm, name: name}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("container %s log:\n%s", name, pod.logs())
		}
		pm.run("rm", "--force", "--time", "5", name)
	})
	if out, err := pm.run(args...); err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("started %s: podman %s", name, strings.Join(args, " "))
	return pod
}

// nsRun runs argv in namespace ns and returns its combined output.
func nsRun(ns string, argv ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...).CombinedOutput()
	return string(out), err
}

// writeFiles writes name → content files into dir (created).
func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
