//go:build !linux

package ipset

import "context"

// Edit implements Editor with a restore script (no netlink off Linux).
func (e *Exec) Edit(ctx context.Context, set string, add, del []Entry) error {
	return e.Restore(ctx, EditScript(set, add, del))
}
