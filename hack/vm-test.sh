#!/usr/bin/env bash
# Runs the e2e suite in a QEMU guest on a Debian kernel (hack/vm.sh): the
# test binary and vipproxy are built here, run there. Extra arguments go to
# the test binary (e.g. -test.run 'TestIPVS|TestClusterIP'). With VM_PKG=k8s
# it runs test/k8s instead (VIPPROXY_CONTROLPLANE and VIPPROXY_KUBEPROXY
# from the environment, as hack/test.sh sets them).
#
#   hack/vm-test.sh                          # ipvs mode, real IPVS, every test
#   VIPPROXY_E2E_MODES=nftables,iptables hack/vm-test.sh -test.run TestClusterIP
#   VM_KERNEL=linux-image-6.1.0-56-amd64 hack/vm-test.sh
#
# Environment: VIPPROXY_E2E_MODES (default ipvs), VM_KERNEL (a Debian kernel
# package; default bookworm's), VM_TIMEOUT (seconds, default 1500), VM_MEM
# (MiB, default 2048).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"

out=$(mktemp -d /var/tmp/vipproxy-vmtest.XXXXXX)
trap 'rm -rf "$out"' EXIT
pkg=${VM_PKG:-e2e}
go test -c -o "$out/e2e.test" ./test/$pkg
CGO_ENABLED=0 go build -o "$out/vipproxy" ./cmd/vipproxy

export VIPPROXY_E2E_BINARY="$out/vipproxy"
export VIPPROXY_E2E_MODES=${VIPPROXY_E2E_MODES:-ipvs}
export VIPPROXY_E2E_REAL_IPVS=1
# TCG emulation runs everything several times slower: waits stretch.
export VIPPROXY_E2E_TIME_SCALE=${VIPPROXY_E2E_TIME_SCALE:-4}
args=(-t "${VM_TIMEOUT:-1500}")
[ -n "${VM_KERNEL:-}" ] && args+=(-k "$VM_KERNEL")
[ -n "${VM_MEM:-}" ] && args+=(-m "$VM_MEM")
cd test/$pkg
# nf_conntrack is loaded on any node that runs a service proxy, ip_vs on
# one that ran an IPVS proxy; a fresh guest has loaded neither, and tests
# compare their sysctls before and after.
# Not exec: the EXIT trap removes the binaries afterwards.
../../hack/vm.sh "${args[@]}" -- sh -c 'modprobe nf_conntrack && modprobe ip_vs && exec "$@"' vm-test \
	"$out/e2e.test" -test.v -test.count=1 -test.timeout 24m "$@"
