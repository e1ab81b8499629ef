package podstate

import (
	"iter"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/util/sets"
)

// holders says who holds one device of one resource. A device can have
// several: a regular init container and a later container of the same pod
// (through the reuse pool), and reservations next to records. The device is
// allocated while either list is non-empty.
type holders struct {
	owners   []ContainerRef  // containers with a record holding the device; no duplicates
	reserved []ReservationID // pending reservations holding the device
}

func (h *holders) empty() bool { return len(h.owners) == 0 && len(h.reserved) == 0 }

// entry returns the holders of (resource, id), creating them when create is set.
func (l *Ledger) entry(resource, id string, create bool) *holders {
	devs := l.index[resource]
	if devs == nil {
		if !create {
			return nil
		}
		devs = make(map[string]*holders)
		l.index[resource] = devs
	}
	h := devs[id]
	if h == nil && create {
		h = &holders{}
		devs[id] = h
	}
	return h
}

// drop removes the index entry of (resource, id) once nobody holds it.
func (l *Ledger) drop(resource, id string, h *holders) {
	if !h.empty() {
		return
	}
	devs := l.index[resource]
	delete(devs, id)
	if len(devs) == 0 {
		delete(l.index, resource)
	}
}

// hold marks ids (distinct) as held by ref's record for resource.
func (l *Ledger) hold(resource string, ids []string, ref ContainerRef) {
	for _, id := range ids {
		h := l.entry(resource, id, true)
		h.owners = append(h.owners, ref)
	}
}

// release undoes hold.
func (l *Ledger) release(resource string, ids []string, ref ContainerRef) {
	for _, id := range ids {
		h := l.entry(resource, id, false) // present: ref's record holds id
		h.owners = slices.DeleteFunc(h.owners, func(o ContainerRef) bool { return o == ref })
		l.drop(resource, id, h)
	}
}

// Allocated returns a new set of the resource's devices that a record holds
// or a pending reservation has picked. It costs O(allocated devices of the
// resource), whatever the number of pods.
func (l *Ledger) Allocated(resource string) sets.Set[string] {
	return sets.KeySet(l.index[resource])
}

// AllocatedIDs yields what Allocated returns, without copying it. The ledger
// must not change during the iteration.
func (l *Ledger) AllocatedIDs(resource string) iter.Seq[string] {
	return maps.Keys(l.index[resource])
}

// IsAllocated reports whether a record or a pending reservation holds the
// device of resource. O(1).
func (l *Ledger) IsAllocated(resource, id string) bool {
	_, ok := l.index[resource][id]
	return ok
}

// AllocatedCount returns the number of allocated devices of resource. O(1).
// A non-zero count keeps a resource known after its plugin went away.
func (l *Ledger) AllocatedCount(resource string) int { return len(l.index[resource]) }

// AllocatedResources returns, sorted, the resources with at least one
// allocated device.
func (l *Ledger) AllocatedResources() []string { return slices.Sorted(maps.Keys(l.index)) }

// Owners returns, sorted by pod UID then container name, the containers whose
// record for resource holds the device; nil when none. The scope is the
// resource: the same ID under another resource is another device. Pending
// reservations are not owners. Upstream returns one arbitrary pod; all are
// returned here, so a health change reaches every pod sharing the device.
// O(owners of the device).
func (l *Ledger) Owners(resource, id string) []ContainerRef {
	h := l.entry(resource, id, false)
	if h == nil || len(h.owners) == 0 {
		return nil
	}
	out := slices.Clone(h.owners)
	slices.SortFunc(out, compareRefs)
	return out
}
