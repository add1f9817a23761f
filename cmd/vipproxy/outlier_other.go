//go:build !linux

package main

import (
	"errors"
	"fmt"
)

// subscribeConntrack fails: conntrack exists on Linux only.
func subscribeConntrack() (eventReceiver, error) {
	return nil, fmt.Errorf("conntrack events need Linux: %w", errors.ErrUnsupported)
}
