//go:build linux

package main

import "github.com/vipproxy/vipproxy/internal/conntrack"

// subscribeConntrack subscribes to this network namespace's conntrack
// events with a 4 MiB receive buffer (bursts of connections).
func subscribeConntrack() (eventReceiver, error) {
	return conntrack.SubscribeEvents(0, 4<<20)
}

// openConntrack opens this network namespace's conntrack table.
func openConntrack() (conntrack.Table, func(), error) {
	t, err := conntrack.NewNetlinkTable()
	if err != nil {
		return nil, nil, err
	}
	return t, t.Close, nil
}
