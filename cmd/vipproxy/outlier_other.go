//go:build !linux

package main

import (
	"errors"
	"fmt"

	"github.com/vipproxy/vipproxy/internal/conntrack"
)

// subscribeConntrack fails: conntrack exists on Linux only.
func subscribeConntrack() (eventReceiver, error) {
	return nil, fmt.Errorf("conntrack events need Linux: %w", errors.ErrUnsupported)
}

// openConntrack fails: conntrack exists on Linux only.
func openConntrack() (conntrack.Table, func(), error) {
	return nil, nil, fmt.Errorf("conntrack needs Linux: %w", errors.ErrUnsupported)
}
