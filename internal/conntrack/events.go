package conntrack

// EventType is the kind of a conntrack event.
type EventType uint8

// Conntrack event kinds (the NFNLGRP_CONNTRACK_* multicast groups).
const (
	EventNew     EventType = 1
	EventUpdate  EventType = 2
	EventDestroy EventType = 3
)

// Conntrack status bits (enum ip_conntrack_status) an Event carries.
const (
	StatusSeenReply uint32 = 1 << 1
	StatusAssured   uint32 = 1 << 2
)

// TCP conntrack states beside those Live uses.
const (
	TCPSynSent uint8 = 1
	TCPSynRecv uint8 = 2
)

// Event is one conntrack event: an entry created, changed (a TCP state
// change, the first reply) or destroyed.
type Event struct {
	Type   EventType
	Flow   Flow
	Status uint32
}

// Failed reports whether e ends a TCP connection attempt that never got
// an answer from its endpoint but a reset, or none at all: the entry is
// destroyed without having seen a reply (the kernel kills such an entry
// the moment a reset answers its SYN; an unanswered one when its SYN_SENT
// timeout runs out, or when someone deletes it), or moved to CLOSE
// without being assured.
func (e Event) Failed() bool {
	if e.Flow.Protocol != ProtoTCP || e.Status&StatusAssured != 0 {
		return false
	}
	switch e.Type {
	case EventDestroy:
		return e.Status&StatusSeenReply == 0 || e.Flow.TCPState == TCPClose
	case EventUpdate:
		return e.Flow.TCPState == TCPClose
	}
	return false
}
