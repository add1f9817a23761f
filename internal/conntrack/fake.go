package conntrack

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Fake is an in-memory Table for tests. The zero value is an empty table.
// It is safe for concurrent use.
type Fake struct {
	mu    sync.Mutex
	flows []Flow
	// ListErr and DeleteErr, when set, are returned by List and Delete
	// (Delete then removes nothing).
	ListErr, DeleteErr error
	// Lists and Deletes count the calls made.
	Lists, Deletes int
}

var _ Table = (*Fake)(nil)

// Add inserts flows (duplicates of existing entries are ignored).
func (f *Fake) Add(flows ...Flow) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fl := range flows {
		if !slices.Contains(f.flows, fl) {
			f.flows = append(f.flows, fl)
		}
	}
}

// List implements Table.
func (f *Fake) List(family model.AddressType) ([]Flow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Lists++
	if f.ListErr != nil {
		return nil, f.ListErr
	}
	var out []Flow
	for _, fl := range f.flows {
		if fl.Family == family {
			out = append(out, fl)
		}
	}
	return out, nil
}

// Delete implements Table: it removes entries equal to one of flows.
func (f *Fake) Delete(flows []Flow) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Deletes++
	if f.DeleteErr != nil {
		return 0, f.DeleteErr
	}
	n := 0
	f.flows = slices.DeleteFunc(f.flows, func(fl Flow) bool {
		if slices.ContainsFunc(flows, func(d Flow) bool { d.TCPState = fl.TCPState; return d == fl }) {
			n++
			return true
		}
		return false
	})
	return n, nil
}

// Flows returns a copy of the table's entries in insertion order.
func (f *Fake) Flows() []Flow {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.flows)
}

// Dump returns the table as text, one entry per line, sorted.
func (f *Fake) Dump() string {
	var lines []string
	for _, fl := range f.Flows() {
		lines = append(lines, fmt.Sprint(fl))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
