package topology

import (
	"cmp"
	"math/bits"
	"slices"
)

// Tiers splits available devices by how they fit a container's NUMA
// affinity (the kubelet's filterByAffinity). Allocation takes from Aligned
// first, then Unaligned, then NoTopology. Each device is in exactly one
// tier; an empty tier is nil.
type Tiers struct {
	// Aligned devices have at least one NUMA node in the affinity.
	Aligned []string
	// Unaligned devices have NUMA nodes, none of them in the affinity.
	Unaligned []string
	// NoTopology devices report no NUMA node in 0..63 (or the resource is
	// not topology-aware, or there is no affinity).
	NoTopology []string
}

// Tiers sorts the devices of ids (in ID order, each once) that free reports
// available into tiers for the affinity the topology manager chose (the
// kubelet's filterByAffinity). With a nil affinity, or for a resource that
// is not topology-aware (no device names a NUMA node, as Hints reads it),
// every one of them is in NoTopology.
//
// Unlike the kubelet, which returns sets, the order is deterministic and
// follows the kubelet's node walk: nodes in the affinity first, then the
// others, each group by ascending number of available devices on the node
// (ties by node id); within a node, by device ID. A device on several nodes
// is listed once, under the first of its nodes in that order, so a device
// touching the affinity is aligned. NoTopology is sorted by ID.
//
// Node ids outside 0..63 are dropped (they are in no affinity); a device left
// without a node, a device with nil Topology or an empty node list, and an
// ID the census does not know are NoTopology.
func (c *Census) Tiers(affinity *BitMask, ids []string, free func(id string) bool) Tiers {
	if affinity == nil || !c.aware {
		var out []string
		for _, id := range ids {
			if free(id) {
				out = append(out, id)
			}
		}
		return Tiers{NoTopology: out}
	}
	return tiersOf(*affinity, ids, func(id string) (BitMask, bool) {
		if !free(id) {
			return 0, false
		}
		cd, ok := c.devs[id]
		if !ok || cd.slot < 0 {
			return 0, true
		}
		return c.t.slots[cd.slot].sig, true
	})
}

// tiersOf sorts into tiers, as Census.Tiers documents, the devices of ids
// (in ID order, each once) that lookup reports available, with the node set
// it reports for each. Devices keep the order of ids within a rank.
func tiersOf(mask BitMask, ids []string, lookup func(id string) (BitMask, bool)) Tiers {
	type entry struct {
		id   string
		sig  BitMask
		rank int // set once the walk is known
	}
	entries := make([]entry, 0, len(ids))
	var perNode [maxNode + 1]int
	for _, id := range ids {
		sig, ok := lookup(id)
		if !ok {
			continue
		}
		entries = append(entries, entry{id: id, sig: sig})
		for rest := uint64(sig); rest != 0; rest &= rest - 1 {
			perNode[bits.TrailingZeros64(rest)]++
		}
	}

	walk := make([]int, 0, maxNode+1)
	for n, c := range perNode {
		if c > 0 {
			walk = append(walk, n)
		}
	}
	slices.SortFunc(walk, func(a, b int) int {
		if ia, ib := mask.IsSet(a), mask.IsSet(b); ia != ib {
			if ia {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(perNode[a], perNode[b]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	var rankOf [maxNode + 1]int
	inMask := 0
	for i, n := range walk {
		rankOf[n] = i
		if mask.IsSet(n) {
			inMask++
		}
	}

	// A device's rank is the place of its first node in the walk; one with
	// no node ranks last (NoTopology). The entries are in ID order: a
	// stable sort by rank orders them by (rank, ID).
	noTopology := len(walk)
	for i := range entries {
		entries[i].rank = noTopology
		for rest := uint64(entries[i].sig); rest != 0; rest &= rest - 1 {
			entries[i].rank = min(entries[i].rank, rankOf[bits.TrailingZeros64(rest)])
		}
	}
	slices.SortStableFunc(entries, func(a, b entry) int { return cmp.Compare(a.rank, b.rank) })
	var t Tiers
	for _, e := range entries {
		switch {
		case e.rank < inMask:
			t.Aligned = append(t.Aligned, e.id)
		case e.rank < noTopology:
			t.Unaligned = append(t.Unaligned, e.id)
		default:
			t.NoTopology = append(t.NoTopology, e.id)
		}
	}
	return t
}
