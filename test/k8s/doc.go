// Package k8s runs vipproxy in Kubernetes mode against a real control
// plane: etcd and kube-apiserver (built by hack/controlplane.sh) run inside a
// control-plane network namespace, vipproxy runs with --kubeconfig in two
// node namespaces, and tests drive Services, EndpointSlices and Nodes through
// the API with client-go while real TCP/UDP clients in a client namespace
// observe the data plane.
//
// The bed reuses the e2e package's exported helpers (backends, dialing from a
// namespace, the vipproxy build) but has its own topology, so that every
// namespace it creates is named "vpk8s-<pid>-…". Nothing is programmed in the
// machine's own namespace; traffic goes only to addresses inside those
// namespaces.
//
// Tests need root, Linux, iproute2 and nft, and the control-plane binaries:
// VIPPROXY_CONTROLPLANE names a directory holding kube-apiserver and etcd;
// unset, the default cache directory of hack/controlplane.sh is used when it
// holds both. Otherwise the tests skip, saying how to build them.
package k8s
