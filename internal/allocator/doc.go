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
//   - Assigner (implements source.Assigner): per Service and requested IP
//     family a ClusterIP, NodePorts and a health check NodePort, recorded
//     in the Store before the Service gets them; List and WriteTable for
//     "vipproxy services". Assigner.Repair / RunRepair release values held
//     by no live Service only after several consecutive passes saw them
//     leaked, and report out-of-range or doubly held values (slog at error
//     level and the vipproxy_allocator_* metrics) without touching them.
package allocator
