// Package e2e is vipproxy's real-kernel end-to-end test bed.
//
// Tests build a topology of network namespaces joined by veth pairs — a LAN
// namespace holding a bridge, two node namespaces that route a pod CIDR each,
// pod namespaces running in-process TCP/UDP backends, and an external client
// namespace — then run the vipproxy binary inside the node namespaces in
// standalone mode (--manifests) and assert what real clients observe.
//
// Everything runs inside namespaces the test creates (names start with
// "vpe2e-"); nothing is programmed in the machine's own namespace. Tests need
// root and iproute2/nft on Linux and skip with a message otherwise.
//
// Every scenario runs once per mode, as a subtest named by the mode. Choose
// modes with VIPPROXY_E2E_MODES=nftables,iptables (comma-separated; default:
// all of nftables, iptables, ipvs, userspace) or with -run 'TestName/nftables'.
// Scenarios are parallel; -parallel N bounds how many run at once. VIPPROXY_E2E_BINARY points at a
// prebuilt vipproxy binary instead of building ./cmd/vipproxy once per run.
package e2e
