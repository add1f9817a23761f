//go:build !linux

package conntrack

import (
	"errors"

	"github.com/vishvananda/netns"

	"github.com/vipproxy/vipproxy/internal/model"
)

// NetlinkTable is the kernel's conntrack table; conntrack exists on Linux
// only, so here its constructors fail with errors.ErrUnsupported.
type NetlinkTable struct{}

var _ Table = (*NetlinkTable)(nil)

var errNoConntrack = errors.Join(errors.New("conntrack: netlink conntrack needs Linux"), errors.ErrUnsupported)

// NewNetlinkTable fails with errors.ErrUnsupported.
func NewNetlinkTable() (*NetlinkTable, error) { return nil, errNoConntrack }

// NewNetlinkTableAt fails with errors.ErrUnsupported.
func NewNetlinkTableAt(netns.NsHandle) (*NetlinkTable, error) { return nil, errNoConntrack }

// Close does nothing.
func (t *NetlinkTable) Close() {}

// List fails with errors.ErrUnsupported.
func (t *NetlinkTable) List(model.AddressType) ([]Flow, error) { return nil, errNoConntrack }

// Delete fails with errors.ErrUnsupported.
func (t *NetlinkTable) Delete([]Flow) (int, error) { return 0, errNoConntrack }
