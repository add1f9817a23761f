#!/usr/bin/env bash
# A self-contained vipproxy demo: standalone mode, default (nftables) mode,
# inside throwaway network namespaces. It builds vipproxy, starts two
# backends in a "pod" namespace, points a Service's ClusterIP at them through
# a manifests directory, connects through the VIP from the "node" namespace,
# then changes the manifests live, and finally runs --cleanup. Nothing is
# programmed in the host's own namespace. Needs root (network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
[ "$(id -u)" -eq 0 ] || { echo "demo: run as root (it creates network namespaces)" >&2; exit 1; }

hack/deps.sh
mkdir -p bin
go build -o bin/vipproxy ./cmd/vipproxy

node=vpdemo-node-$$
pod=vpdemo-pod-$$
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	ip netns del "$node" 2>/dev/null || true
	ip netns del "$pod" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

# node <-veth-> pod; the pod holds both backend addresses.
ip netns add "$node"
ip netns add "$pod"
ip -n "$node" link set lo up
ip -n "$pod" link set lo up
ip link add vpd-n$$ netns "$node" type veth peer name vpd-p$$ netns "$pod"
ip -n "$node" addr add 10.244.0.1/24 dev vpd-n$$
ip -n "$pod" addr add 10.244.0.11/24 dev vpd-p$$
ip -n "$pod" addr add 10.244.0.12/24 dev vpd-p$$
ip -n "$node" link set vpd-n$$ up
ip -n "$pod" link set vpd-p$$ up
ip -n "$pod" route add default via 10.244.0.1
# A node has a default route; ours points into the pod network.
ip -n "$node" route add default via 10.244.0.11

for b in 11 12; do
	ip netns exec "$pod" socat TCP-LISTEN:8080,bind=10.244.0.$b,fork,reuseaddr SYSTEM:"echo backend-$b" &
	pids+=($!)
done

mkdir -p "$work/manifests"
cat > "$work/manifests/web.yaml" <<YAML
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.0.11]
  conditions: {ready: true}
  nodeName: demo-node
- addresses: [10.244.0.12]
  conditions: {ready: true}
  nodeName: demo-node
YAML

ip netns exec "$node" bin/vipproxy --manifests "$work/manifests" --state-dir "$work/state" \
	--hostname-override demo-node --cluster-cidr 10.244.0.0/16 \
	--healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 \
	--iptables-min-sync-period 0s -v 2 >"$work/vipproxy.log" 2>&1 &
pids+=($!)

healthy=
for _ in $(seq 50); do
	if ip netns exec "$node" socat -T1 - TCP:127.0.0.1:10256 <<<$'GET /healthz HTTP/1.0\r\n\r\n' 2>/dev/null | grep -q '200 OK'; then
		healthy=1
		break
	fi
	sleep 0.2
done
[ -n "$healthy" ] || { echo "demo: vipproxy did not become healthy; log:"; cat "$work/vipproxy.log"; exit 1; }

echo "== 6 connections to the ClusterIP 10.96.0.10:80 =="
for _ in $(seq 6); do ip netns exec "$node" socat -T2 - TCP:10.96.0.10:80 </dev/null; done
echo "== the nftables table vipproxy programmed (first lines) =="
ip netns exec "$node" nft list table ip vipproxy | sed -n 1,25p
echo "== scale to one endpoint (edit the manifest live) =="
sed -i '/10.244.0.12/,+2d' "$work/manifests/web.yaml"
sleep 1
for _ in $(seq 3); do ip netns exec "$node" socat -T2 - TCP:10.96.0.10:80 </dev/null; done
echo "== vipproxy --cleanup =="
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
ip netns exec "$node" bin/vipproxy --cleanup
echo "ruleset after cleanup: '$(ip netns exec "$node" nft list ruleset)'"
