#!/usr/bin/env bash
# Installs what vipproxy's build, demo and tests need on a Debian machine:
# the netfilter user-space tools and socat. Go itself is expected at
# /usr/local/go or on PATH. Safe to run again; installs only what is missing.
set -euo pipefail

export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
need=()
for pair in nft:nftables iptables:iptables conntrack:conntrack ipset:ipset ip:iproute2 socat:socat; do
	command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if [ "${#need[@]}" -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "deps: missing ${need[*]}; run as root (or install them) first" >&2
		exit 1
	fi
	echo "deps: installing ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v go >/dev/null || { echo "deps: Go not found (expected /usr/local/go/bin/go)" >&2; exit 1; }
go mod download
