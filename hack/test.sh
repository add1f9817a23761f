#!/usr/bin/env bash
# Sets up and runs every vipproxy test: formatting, vet, unit tests and, as
# root, the real-kernel tests (network namespaces only; the host's own rules
# are never touched). Extra arguments go to `go test` (e.g. -run Foo).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"

hack/deps.sh

unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt needed on:" >&2
	echo "$unformatted" >&2
	exit 1
fi
go vet ./...
# Cross-builds: the userspace mode and the command must build everywhere.
for os in darwin windows; do
	GOOS=$os GOARCH=amd64 go build -o /dev/null ./cmd/vipproxy
done
if [ "$(id -u)" -ne 0 ]; then
	echo "test: not root: real-kernel (netns) and Kubernetes-mode tests will skip" >&2
else
	# A real kube-apiserver and etcd for test/k8s, built from the Go module
	# proxy once and cached (about 10 min on an idle 2-core machine).
	export VIPPROXY_CONTROLPLANE="$(hack/controlplane.sh)"
	# kube-proxy v1.34, built from the Go module proxy once and cached
	# (about 2.5 min), for test/k8s's side-by-side metrics comparison.
	export VIPPROXY_KUBEPROXY="$(hack/kubeproxy.sh)/kube-proxy"
	# The OCI image (hack/image.sh: debootstrap + umoci, base layer cached),
	# run by podman with runc in test/k8s's kubeadm image-swap test.
	need=()
	for pair in podman:podman runc:runc umoci:umoci debootstrap:debootstrap; do
		command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
	done
	if [ "${#need[@]}" -gt 0 ]; then
		echo "test: installing ${need[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	fi
	export VIPPROXY_IMAGE="$(hack/image.sh | tail -1)"
fi
go test -count=1 -timeout 40m "$@" ./...

if [ "$(id -u)" -eq 0 ] && [ $# -eq 0 ]; then
	# Real kernels: the e2e suite in a QEMU guest booted on Debian's 6.1
	# LTS kernel (hack/vm.sh installs qemu-system-x86, busybox-static, kmod
	# and cpio, and caches the kernel), in ipvs mode on a kernel that has
	# IPVS (no fallback; ipvsadm is the tests' tamper tool).
	command -v ipvsadm >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ipvsadm >/dev/null
	VIPPROXY_E2E_MODES=ipvs hack/vm-test.sh
	# The same suite in nftables and iptables mode (nft and legacy
	# backends) on the LTS kernel; the tests that do not depend on the
	# modes asked for ran in the guest above. The traffic-heavy tests of
	# balancing, slow start, ejection and drain ran in these modes on the
	# host kernel; under emulation their 10,000s of connections starved
	# TestRulesRestored's timing (14.3 s against 12 s, once).
	VIPPROXY_E2E_MODES=nftables,iptables,iptables-legacy hack/vm-test.sh \
		-test.skip 'TestConfigReloadSwitchesMode|TestModeSwitchSequence|TestHealthCheckNodePortAndMetrics|TestInitOnly|TestVipproxyHandle|TestTopology|TestBalancing|TestSlowStart|TestOutlierEjection|TestDrain'
	# Migration from kube-proxy v1.34's ipvs mode, with the real API server.
	VM_PKG=k8s VM_MEM=4096 hack/vm-test.sh -test.run TestMigrateFromKubeProxyIPVS
fi
