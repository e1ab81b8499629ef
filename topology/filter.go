package topology

import (
	"cmp"
	"math/bits"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Tiers splits available devices by how they fit a container's NUMA
// affinity (SPEC 3.5). Allocation takes from Aligned first, then Unaligned,
// then NoTopology. Each device is in exactly one tier; an empty tier is nil.
type Tiers struct {
	// Aligned devices have at least one NUMA node in the affinity.
	Aligned []string
	// Unaligned devices have NUMA nodes, none of them in the affinity.
	Unaligned []string
	// NoTopology devices report no NUMA node in 0..63 (or the resource is
	// not topology-aware, or there is no affinity).
	NoTopology []string
}

// FilterByAffinity sorts the available devices of a resource into tiers for
// the affinity the topology manager chose. With a nil affinity, or for a
// resource that is not topology-aware (Aware), every available device is in
// NoTopology.
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
// available ID missing from devices are NoTopology.
func FilterByAffinity(affinity *BitMask, devices map[string]*pluginapi.Device, available sets.Set[string]) Tiers {
	if affinity == nil || !Aware(devices) {
		return Tiers{NoTopology: nilIfEmpty(sets.List(available))}
	}

	type entry struct {
		id   string
		sig  BitMask
		rank int // position of the device's first node in the walk
	}
	entries := make([]entry, 0, len(available))
	var perNode [maxNode + 1]int
	for id := range available {
		sig, _ := signature(devices[id])
		entries = append(entries, entry{id: id, sig: sig})
		for rest := uint64(sig); rest != 0; rest &= rest - 1 {
			perNode[bits.TrailingZeros64(rest)]++
		}
	}

	mask := *affinity
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

	noTopology := len(walk)
	for i := range entries {
		e := &entries[i]
		e.rank = noTopology
		for rest := uint64(e.sig); rest != 0; rest &= rest - 1 {
			e.rank = min(e.rank, rankOf[bits.TrailingZeros64(rest)])
		}
	}
	slices.SortFunc(entries, func(a, b entry) int {
		if c := cmp.Compare(a.rank, b.rank); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})

	ids := make([]string, len(entries))
	aligned, unaligned := 0, 0
	for i, e := range entries {
		ids[i] = e.id
		switch {
		case e.rank < inMask:
			aligned++
		case e.rank < noTopology:
			unaligned++
		}
	}
	return Tiers{
		Aligned:    nilIfEmpty(ids[:aligned:aligned]),
		Unaligned:  nilIfEmpty(ids[aligned : aligned+unaligned : aligned+unaligned]),
		NoTopology: nilIfEmpty(ids[aligned+unaligned:]),
	}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}
