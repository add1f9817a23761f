// Package bench measures vipproxy side by side with kube-proxy: the library
// behind bench/cmd/vipproxy-bench (issue 10).
//
// Every measurement runs in a fresh pair of network namespaces named
// "vpbench-<pid>-<seq>-node" and "…-pod" (plus "…-cp" for the control plane
// in Kubernetes mode); nothing is programmed in the machine's own namespace
// and the namespaces are deleted afterwards. The node namespace runs the
// proxy and is the client; the pod namespace holds ten real backends
// (10.244.0.10-19:8080) and treats the whole Service CIDR as local, so a
// connect to a VIP the proxy has not programmed is refused at once.
//
// A Set is N Services × M endpoints. Every 100th Service (every 10th below
// N = 1,000) and the last point at the real backends, the rest at addresses
// in a pod range where nothing answers. A few Services ("change targets")
// start with their endpoints on a port nothing listens on; a change moves
// them to the real port.
//
// Measured per target (vipproxy standalone, vipproxy in Kubernetes mode,
// kube-proxy) and N:
//
//   - cold start: process start → first successful connect through the last
//     Service's VIP (objects written before the start);
//   - programming latency: manifest write or EndpointSlice update through
//     the API → first successful connect through the changed VIP, polled
//     every millisecond, p50/p99 over the changes;
//   - RSS (VmRSS) and CPU seconds (utime+stime of the proxy and its waited
//     children) once the proxy's CPU went quiet after the cold start, and
//     the CPU per change (first change → quiet after the last, divided by
//     the changes);
//   - first-packet latency: TCP connect time through VIPs with real
//     backends, with N Services and with the 10-Service baseline set.
//     With -annotate the N Services carry annotations (a feature on);
//     with -annotate-half only half of them do, and the connects alternate
//     between the two halves in one loop, the plain half's latency in the
//     note: a feature's cost without the drift between runs.
//
// Each measurement is capped (Config.Timeout); a cap that fires prints as
// "> timeout" instead of hanging the run.
package bench
