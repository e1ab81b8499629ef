package topology

import "fmt"

// Hint is one placement a resource can accept, as the topology manager
// consumes it.
type Hint struct {
	// NUMANodeAffinity is the set of NUMA nodes of the placement; nil means
	// the resource has no preference.
	NUMANodeAffinity *BitMask
	// Preferred is true when the mask has the fewest nodes any placement of
	// the request could have.
	Preferred bool
}

// LessThan orders hints best first: preferred before not preferred, then the
// narrower affinity (BitMask.IsNarrowerThan). A nil affinity sorts after any
// mask of the same preference.
func (h Hint) LessThan(o Hint) bool {
	if h.Preferred != o.Preferred {
		return h.Preferred
	}
	switch {
	case h.NUMANodeAffinity == nil:
		return false
	case o.NUMANodeAffinity == nil:
		return true
	}
	return h.NUMANodeAffinity.IsNarrowerThan(*o.NUMANodeAffinity)
}

// String renders the hint as the kubelet logs it: "{01 true}", or
// "{<nil> false}" without affinity.
func (h Hint) String() string {
	affinity := "<nil>"
	if h.NUMANodeAffinity != nil {
		affinity = h.NUMANodeAffinity.String()
	}
	return fmt.Sprintf("{%s %t}", affinity, h.Preferred)
}

// AffinityStore returns the hint the topology manager chose for a container
// (the kubelet's topologymanager.Store). Device selection aligns devices to
// its NUMANodeAffinity.
type AffinityStore interface {
	GetAffinity(podUID, containerName string) Hint
}
