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
