// Package source defines how inputs reach the reconcile loop: a Source
// emits complete Snapshots of Services, EndpointSlices and this Node.
package source

import (
	"context"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Source watches its inputs and emits complete, consistent snapshots.
//
// Run blocks until ctx is done or the source fails for good. It sends the
// first snapshot once every input has been read once (the "synced" point)
// and another after every change (debounced by the source). Snapshots are
// never mutated after they are sent. Per-object problems go into
// Snapshot.Problems; they are never returned as errors.
type Source interface {
	Run(ctx context.Context, out chan<- *model.Snapshot) error
}

// Assigner gives a Service the ClusterIPs and NodePorts its manifest leaves
// empty (standalone mode; in Kubernetes mode the API server does this).
//
// Assign returns svc with ClusterIPs (per requested family, unless Headless
// or ExternalName), NodePorts (Type NodePort or LoadBalancer) and
// HealthCheckNodePort (LoadBalancer with ExternalTrafficPolicy Local)
// filled in. Values the manifest fixes must be in range and not owned by
// another Service, else the error says which (it wraps allocator's typed
// errors). Assign is idempotent: the same Service gets the same values,
// across restarts when the store is durable; values the Service no longer
// asks for are released.
//
// Release frees everything svc owns; releasing an unknown Service is not an
// error.
type Assigner interface {
	Assign(ctx context.Context, svc model.Service) (model.Service, error)
	Release(ctx context.Context, svc model.ServiceName) error
}

// BatchAssigner is an Assigner that can also assign many Services at
// once, several per store update, so a cold start of thousands of manifests
// costs tens of durable writes instead of thousands. out[i] and errs[i]
// belong to svcs[i], with Assign's semantics for each; out[i] is svcs[i]
// itself when the Assigner filled nothing in (the Service names its
// addresses, or has them already) or refused it, else a new Service. The
// svcs are not modified.
type BatchAssigner interface {
	Assigner
	AssignAll(ctx context.Context, svcs []*model.Service) (out []*model.Service, errs []error)
}
