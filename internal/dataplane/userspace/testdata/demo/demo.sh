#!/bin/sh
# Standalone demo of --proxy-mode userspace running unprivileged (uid 65534,
# no capabilities) with a 127.0.0.0/8 service range, inside its own network
# namespace (vpus-demo) so nothing touches the host. Needs root to set up the
# namespace, iproute2, setpriv and socat. Usage: demo.sh /path/to/vipproxy
set -eu
BIN=${1:?usage: demo.sh /path/to/vipproxy}
HERE=$(cd "$(dirname "$0")" && pwd)
NS=vpus-demo
WORK=$(mktemp -d /tmp/vpus-demo-XXXXXX)
PIDS=""
cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	ip netns del $NS 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
cp -r "$HERE/manifests" "$BIN" "$WORK/" && chmod -R a+rwX "$WORK"
ip netns add $NS
ip -n $NS link set lo up
# Two "pods" (backends) and a node address; endpoints may not be loopback.
ip -n $NS addr add 10.200.0.1/32 dev lo
ip -n $NS addr add 10.200.0.2/32 dev lo
# exec: a backgrounded call then has the PID of the process itself, so
# cleanup can kill it (timeout passes the signal on to its child).
asuser() { exec ip netns exec $NS setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all "$@"; }
for i in 1 2; do
	asuser timeout 120 socat TCP-LISTEN:8080,bind=10.200.0.$i,fork,reuseaddr SYSTEM:"echo backend-$i" >/dev/null 2>&1 &
	PIDS="$PIDS $!"
	# A one-socket UDP answerer (socat's UDP-RECVFROM,fork loses datagrams).
	asuser timeout 120 python3 -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('10.200.0.$i', 5353))
while True:
    d, a = s.recvfrom(2048)
    s.sendto(b'dns-$i\\n', a)
" >/dev/null 2>&1 &
	PIDS="$PIDS $!"
done
asuser timeout 120 "$WORK/$(basename "$BIN")" --manifests "$WORK/manifests" --proxy-mode userspace \
	--service-cluster-ip-range 127.100.0.0/16 --state-dir "$WORK/state" --hostname-override demo \
	--healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 >"$WORK/vipproxy.log" 2>&1 &
PIDS="$PIDS $!"
sleep 3
echo "--- vipproxy log"; cat "$WORK/vipproxy.log"
echo "--- listeners"; ip netns exec $NS ss -ltnup | grep vipproxy || true
VIP=$(ip netns exec $NS ss -ltnH | awk '$4 ~ /^127\.100\./ {sub(/:[0-9]+$/, "", $4); print $4; exit}')
NP=$(ip netns exec $NS ss -lunH | awk '$4 ~ /^10\.200\.0\.1:3/ {sub(/^.*:/, "", $4); print $4; exit}')
echo "--- TCP via ClusterIP $VIP:8080 (round robin)"
for i in 1 2 3 4; do ip netns exec $NS timeout 3 socat -T2 - TCP:$VIP:8080 </dev/null; done
echo "--- UDP via NodePort 10.200.0.1:$NP"
for i in 1 2 3 4; do echo q | ip netns exec $NS timeout 3 socat -T1 - UDP:10.200.0.1:$NP; done
echo "--- /proxyMode: $(ip netns exec $NS timeout 3 socat -T2 - TCP:127.0.0.1:10249 <<'R' | tail -1
GET /proxyMode HTTP/1.0

R
)"
