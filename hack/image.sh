#!/usr/bin/env bash
# Builds vipproxy's OCI image without a registry or a Docker engine and
# prints the OCI archive's path as its last line on stdout.
#
#   hack/image.sh                 # build (the base layer is cached)
#   podman load -i "$(hack/image.sh | tail -1)"
#
# The image has two layers:
#   1. a Debian bookworm root filesystem made by debootstrap (minbase) with the
#      tools vipproxy drives: nftables, iptables (both the nft and the legacy
#      backend), ipset, conntrack, iproute2 and ca-certificates. Built once
#      and cached: about 40 s and 95 MiB uncompressed after trimming.
#   2. the static vipproxy binary at /usr/local/bin/vipproxy, and
#      /usr/local/bin/kube-proxy linking to it, so kubeadm's DaemonSet
#      (command /usr/local/bin/kube-proxy --config=...) runs it unchanged.
# umoci (Debian's package) assembles the OCI layout; the archive is a tar of
# that layout, which podman, skopeo and `ctr import` read.
#
# Environment:
#   IMAGE_DIR   output and cache directory (default
#               ${XDG_CACHE_HOME:-$HOME/.cache}/vipproxy/image)
#   IMAGE_TAG   the image's tag (default: vipproxy-<git short hash>, or
#               "dev" outside git); the archive's name carries it too
#   DEBIAN_MIRROR  (default http://deb.debian.org/debian)
# Needs root (debootstrap), and installs debootstrap and umoci when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"

dir=${IMAGE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vipproxy/image}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=nftables,iptables,ipset,conntrack,iproute2,ca-certificates
tag=${IMAGE_TAG:-$(git rev-parse --short HEAD 2>/dev/null || echo dev)}
log() { echo "image: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
	echo "image: debootstrap needs root" >&2
	exit 1
fi
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v umoci >/dev/null || need+=(umoci)
if [ "${#need[@]}" -gt 0 ]; then
	log "installing ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
mkdir -p "$dir"

# Layer 1: the base root filesystem, cached under a name that changes with
# the package list and the suite.
base="$dir/rootfs-bookworm-$(echo "$packages" | sha256sum | cut -c1-12)"
if [ ! -f "$base.complete" ]; then
	rm -rf "$base"
	log "debootstrap bookworm ($packages) into $base"
	start=$(date +%s)
	debootstrap --variant=minbase --include="$packages" bookworm "$base" "$mirror" >"$dir/debootstrap.log" 2>&1 ||
		{ tail -20 "$dir/debootstrap.log" >&2; exit 1; }
	# What a container never uses: package caches, lists, docs, locales.
	rm -rf "$base"/var/cache/apt/* "$base"/var/lib/apt/lists/* "$base"/usr/share/doc \
		"$base"/usr/share/man "$base"/usr/share/info "$base"/usr/share/locale "$base"/var/log/*
	# The host's lock file and modules come from kubeadm's hostPath mounts.
	mkdir -p "$base/run" "$base/lib/modules"
	# The base layer, compressed once (gzip of 100 MiB is most of a build).
	rm -rf "$base.layout"
	umoci init --layout "$base.layout"
	umoci new --image "$base.layout:base"
	umoci insert --image "$base.layout:base" "$base" / >/dev/null
	touch "$base.complete"
	log "base ready in $(($(date +%s) - start)) s ($(du -sh "$base" | cut -f1))"
fi

# Layer 2: the binary, built static so that it needs nothing from layer 1.
work=$(mktemp -d "$dir/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin/usr/local/bin"
log "building vipproxy"
CGO_ENABLED=0 go build -buildvcs=auto -trimpath -ldflags="-s -w" -o "$work/bin/usr/local/bin/vipproxy" ./cmd/vipproxy
ln -s vipproxy "$work/bin/usr/local/bin/kube-proxy"

layout="$work/layout"
cp -a "$base.layout" "$layout"
umoci tag --image "$layout:base" "$tag"
umoci rm --image "$layout:base"
umoci insert --image "$layout:$tag" "$work/bin/usr/local/bin" /usr/local/bin >/dev/null
umoci config --image "$layout:$tag" \
	--config.entrypoint /usr/local/bin/vipproxy \
	--config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	--config.label org.opencontainers.image.title=vipproxy \
	--config.label org.opencontainers.image.source=https://github.com/vipproxy/vipproxy \
	--config.label org.opencontainers.image.revision="$tag" \
	--os linux --architecture amd64 \
	--author vipproxy --history.comment "hack/image.sh" >/dev/null
umoci gc --layout "$layout"

archive="$dir/vipproxy-$tag.oci.tar"
tar -C "$layout" -cf "$archive.tmp" .
mv "$archive.tmp" "$archive"
log "image vipproxy:$tag, $(du -h "$archive" | cut -f1) compressed layers"
echo "$archive"
