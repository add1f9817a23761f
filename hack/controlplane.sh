#!/usr/bin/env bash
# Builds kube-apiserver and etcd from the Go module proxy into a cache
# directory, for the Kubernetes-mode tests in test/k8s. Prints the directory
# (the only line on stdout); set VIPPROXY_CONTROLPLANE to it to run the tests.
#
#   hack/controlplane.sh            # build once, then reuse
#   VIPPROXY_CONTROLPLANE=$(hack/controlplane.sh) go test ./test/k8s/
#
# Environment:
#   KUBE_VERSION   k8s.io/kubernetes version (default v1.37.2; the staging
#                  modules k8s.io/* are pinned to the matching v0.x.y)
#   ETCD_VERSION   go.etcd.io/etcd/server/v3 version (default v3.7.3)
#   CONTROLPLANE_DIR  where the binaries go (default
#                  ${XDG_CACHE_HOME:-$HOME/.cache}/vipproxy/controlplane/<kube>-<etcd>)
#
# The helper module is generated in a temporary directory and removed; nothing
# is written to the work tree. A directory holding both binaries and a
# complete-marker is reused as it is. Build logs go to stderr.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"

KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
staging_version="v0.${KUBE_VERSION#v1.}"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/vipproxy/controlplane"
out=${CONTROLPLANE_DIR:-$cache_root/$KUBE_VERSION-etcd-$ETCD_VERSION}

if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ] && [ -f "$out/.complete" ]; then
	echo "controlplane: reusing $out" >&2
	echo "$out"
	exit 0
fi

mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

export GOFLAGS=-mod=mod
export GOWORK=off
export CGO_ENABLED=0

# kube-apiserver: k8s.io/kubernetes requires its staging modules at v0.0.0
# and replaces them with ./staging/src/...; a consumer must replace each of
# them with the published release. The list is read from the module's own
# go.mod so it follows the version.
mkdir -p "$work/apiserver"
gomod=$(cd "$work/apiserver" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
if [ ! -f "$gomod" ]; then
	echo "controlplane: cannot read go.mod of k8s.io/kubernetes@$KUBE_VERSION" >&2
	exit 1
fi
staging=$(grep -oE '^[[:space:]]*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk '{print $1}' | sort -u)
if [ -z "$staging" ]; then
	echo "controlplane: no staging replaces found in $gomod" >&2
	exit 1
fi
go_line=$(grep -E '^go [0-9]' "$gomod" | head -1)
{
	echo "module vipproxy.local/controlplane"
	echo
	echo "$go_line"
	echo
	echo "require k8s.io/kubernetes $KUBE_VERSION"
	echo
	echo "replace ("
	for m in $staging; do
		echo "	$m => $m $staging_version"
	done
	echo ")"
} >"$work/apiserver/go.mod"
cat >"$work/apiserver/tools.go" <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
echo "controlplane: building kube-apiserver $KUBE_VERSION (staging $staging_version) into $out" >&2
(cd "$work/apiserver" && go mod download >&2 && go build -trimpath -ldflags="-s -w" -o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver) >&2
t_api=$(date +%s)

# etcd: the server module's etcdmain package is the whole etcd binary.
mkdir -p "$work/etcd"
cat >"$work/etcd/go.mod" <<GOMOD
module vipproxy.local/etcd

go 1.26

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
cat >"$work/etcd/main.go" <<'GO'
// Command etcd is etcd's server, built from go.etcd.io/etcd/server/v3.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
echo "controlplane: building etcd $ETCD_VERSION into $out" >&2
(cd "$work/etcd" && go mod tidy >&2 && go build -trimpath -ldflags="-s -w" -o "$out/etcd" .) >&2
end=$(date +%s)

touch "$out/.complete"
echo "controlplane: built in $((end - start)) s (kube-apiserver $((t_api - start)) s, etcd $((end - t_api)) s)" >&2
echo "$out"
