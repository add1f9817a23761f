package ipset

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// InUseRetry is how long Destroy keeps retrying a set the kernel still
// holds, and InUsePause the pause between tries. Variables so tests can
// shorten them.
var InUseRetry, InUsePause = 15 * time.Second, 250 * time.Millisecond

// Destroy destroys every set whose name match accepts and returns their
// names and how long it waited for the kernel to let go of them. A set is
// "in use by a kernel component" while a rule matches it, so the caller
// removes those rules first; and nf_tables frees deleted rules after an
// RCU grace period, asynchronously, so right after the rules go,
// destroying may still fail for a moment. That one failure is retried for
// up to InUseRetry. When sets cannot be listed (no ipset binary, no kernel
// support) there is nothing to destroy and Destroy succeeds.
func Destroy(ctx context.Context, r Runner, match func(name string) bool) ([]string, time.Duration, error) {
	names, err := r.List(ctx)
	if err != nil {
		return nil, 0, nil
	}
	script, found := destroyScript(names, match)
	if len(found) == 0 {
		return nil, 0, nil
	}
	start := time.Now()
	deadline := start.Add(InUseRetry)
	for {
		err = r.Restore(ctx, []byte(script))
		if err == nil || !strings.Contains(err.Error(), "in use") || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, time.Since(start), fmt.Errorf("ipset: destroy %v: %w", found, errors.Join(err, ctx.Err()))
		case <-time.After(InUsePause):
		}
		// A try may have destroyed the sets before the one in use.
		if names, lerr := r.List(ctx); lerr == nil {
			var left []string
			if script, left = destroyScript(names, match); len(left) == 0 {
				return found, time.Since(start), nil
			}
		}
	}
	if err != nil {
		return nil, time.Since(start), fmt.Errorf("ipset: destroy %v: %w", found, err)
	}
	return found, time.Since(start), nil
}

// destroyScript returns the restore script destroying the sets among
// names that match accepts, and their names.
func destroyScript(names []string, match func(string) bool) (script string, found []string) {
	var b strings.Builder
	for _, n := range names {
		if match(n) {
			b.WriteString("destroy " + n + "\n")
			found = append(found, n)
		}
	}
	return b.String(), found
}
