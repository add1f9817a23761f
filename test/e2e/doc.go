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
//
// Scenarios (issue 3), one test each, every one run per mode:
//
//	 1 TestClusterIP                          ClusterIP TCP/UDP from pods and nodes, multi-port, 300-connection spread
//	 2 TestNodePortLoadBalancerExternalIP     NodePort on both nodes, LB ingress IP, externalIPs
//	   TestNodePortDefaultAddresses           NodePort on the node's primary IPs without --nodeport-addresses
//	 3 TestLoadBalancerSourceRanges           allowed client answered, other client dropped
//	 4 TestSessionAffinity                    ClientIP sticks for 20 connections, expires after timeoutSeconds 2
//	 5 TestNoEndpoints                        connection refused within 1 s (no slice, empty slice, not serving)
//	 6 TestExternalTrafficPolicy              Local keeps client IP / drops elsewhere; Cluster answers on both; healthCheckNodePort
//	 7 TestInternalPolicyTerminatingTopology  internalTrafficPolicy Local, serving-terminating fallback, zone hints
//	 8 TestEndpointReplacedUDP                fixed-source-port UDP clients (ClusterIP, NodePort) move within 2 s; 1→0→1
//	 9 TestHairpin                            a pod reaches itself through its Service
//	10 TestIgnoredServices                    service-proxy-name label and headless Services ignored
//	11 TestRestartUnderLoad                   SIGKILL + restart under 50 streams: byte-exact, no failed new connection
//	12 TestRulesRestored                      deleted / flushed rules back within one syncPeriod
//	13 TestCleanupRestoresRuleset             --cleanup restores ruleset, addresses, routes exactly
//	14 TestDualStack                          IPv6 ClusterIP and NodePort of a dual-stack Service
//	15 TestBadInputWhileRunning               malformed file + invalid Service: others keep answering, log names file and field
//	   TestMigrationRemovesLeftovers          another mode's and kube-proxy's rules are removed at start
//	   TestHealthAndMetrics                   /healthz, /livez, /metrics
//
// TestTopology and TestVipproxyHandle prove the bed itself without vipproxy.
package e2e
