#!/usr/bin/env bash
# Builds kube-proxy from the Go module proxy into a cache directory, for the
# side-by-side benchmark in bench/ (go run ./bench/cmd/vipproxy-bench
# --kube-proxy DIR/kube-proxy). Prints the directory (the only line on
# stdout). A directory holding the binary and a complete-marker is reused.
#
#   hack/kubeproxy.sh               # build once, then reuse
#
# Environment:
#   KUBE_PROXY_VERSION  k8s.io/kubernetes version (default v1.34.4, the newest
#                       v1.34 the module proxy serves; the staging modules
#                       k8s.io/* are pinned to the matching v0.x.y)
#   KUBEPROXY_DIR       where the binary goes (default
#                       ${XDG_CACHE_HOME:-$HOME/.cache}/vipproxy/kube-proxy/<version>)
#
# The helper module is generated in a temporary directory and removed; nothing
# is written to the work tree. Build logs go to stderr.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"

KUBE_PROXY_VERSION=${KUBE_PROXY_VERSION:-v1.34.4}
staging_version="v0.${KUBE_PROXY_VERSION#v1.}"
out=${KUBEPROXY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vipproxy/kube-proxy/$KUBE_PROXY_VERSION}

if [ -x "$out/kube-proxy" ] && [ -f "$out/.complete" ]; then
	echo "kubeproxy: reusing $out" >&2
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

# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them
# with ./staging/src/...; a consumer replaces each with the published release.
# The list comes from the module's own go.mod so it follows the version.
gomod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$KUBE_PROXY_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
if [ ! -f "$gomod" ]; then
	echo "kubeproxy: cannot read go.mod of k8s.io/kubernetes@$KUBE_PROXY_VERSION" >&2
	exit 1
fi
staging=$(grep -oE '^[[:space:]]*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk '{print $1}' | sort -u)
if [ -z "$staging" ]; then
	echo "kubeproxy: no staging replaces found in $gomod" >&2
	exit 1
fi
go_line=$(grep -E '^go [0-9]' "$gomod" | head -1)
{
	echo "module vipproxy.local/kubeproxy"
	echo
	echo "$go_line"
	echo
	echo "require k8s.io/kubernetes $KUBE_PROXY_VERSION"
	echo
	echo "replace ("
	for m in $staging; do
		echo "	$m => $m $staging_version"
	done
	echo ")"
} >"$work/go.mod"
cat >"$work/tools.go" <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-proxy"
GO
# Stamp the version so `kube-proxy --version` and its logs name it.
minor=${KUBE_PROXY_VERSION#v1.}
minor=${minor%%.*}
ldversion="-X k8s.io/component-base/version.gitVersion=$KUBE_PROXY_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
echo "kubeproxy: building kube-proxy $KUBE_PROXY_VERSION (staging $staging_version) into $out" >&2
(cd "$work" && go mod download >&2 && go build -trimpath -ldflags="-s -w $ldversion" -o "$out/kube-proxy" k8s.io/kubernetes/cmd/kube-proxy) >&2
end=$(date +%s)

touch "$out/.complete"
echo "kubeproxy: built in $((end - start)) s" >&2
echo "$out"
