// Package allocator gives Services their ClusterIPs and NodePorts in
// standalone mode, the way the Kubernetes API server does in a cluster.
//
// It has three layers:
//
//   - IPRange and PortRange: bitmap allocators over a service CIDR and a
//     NodePort range. Each range is split into a static (lower) band, which
//     users should pick fixed values from, and a dynamic (upper) band that
//     AllocateNext prefers (upstream's ServiceIPStaticSubrange and
//     ServiceNodePortStaticSubrange). Errors are typed: ErrAllocated,
//     *ErrNotInRange, ErrFull.
//   - Store: the durable allocation Map (which Service owns which IPs and
//     ports) with a revision and compare-and-swap updates. OpenStore picks a
//     bbolt file (default) or etcd (shared between hosts).
//   - Assigner (implements source.Assigner) and the repair loop (Repairer),
//     which releases leaked values only after they were seen leaked in
//     several consecutive passes.
package allocator
