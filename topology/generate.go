package topology

import "k8s.io/apimachinery/pkg/util/sets"

// Hints returns the topology hints of the resource for a request of request
// devices, as the kubelet's GetTopologyHints (container scope) and
// GetPodTopologyHints (pod scope) do. The available devices are the healthy
// ones that allocated does not hold; reusable is the reuse pool, the devices
// regular init containers of the pod hold and later containers may take
// (container scope; nil at pod scope); held are the devices the container
// (or, at pod scope, the pod) already holds, nil or empty if none. Hints
// returns:
//   - nil (no preference) when no device names a NUMA node (any id counts,
//     even one outside 0..63 or unknown to the machine; nil Topology, an
//     empty node list and nil list entries do not), or when machineNodes
//     holds no id in 0..63 (a machine without NUMA information);
//   - when held is not empty: an empty non-nil slice if its size differs
//     from request, else the masks below with exactly the held devices as
//     the available ones, healthy or not, and no reuse pool;
//   - otherwise an empty non-nil slice (nothing can satisfy the request)
//     when the available and reusable devices together number fewer than
//     request, else the masks below.
//
// The masks are those of the kubelet's generateDeviceTopologyHints, always
// a non-nil slice, empty when no mask fits. Candidate nodes are the NUMA
// nodes any device reports (healthy or not) that machineNodes also lists,
// ascending; when there are none, the ids of machineNodes in 0..63 in their
// given order. Every non-empty subset of the candidates is tried, in
// eachSubset's order, which is also the order of the result. A mask is kept
// when no reusable device with a Topology lies wholly outside it (such a
// device, even one with an empty node list, rejects the mask; one with nil
// Topology is ignored) and the reusable devices with a Topology plus the
// available devices with a node in the mask number at least request. A kept
// mask is Preferred when it has as few nodes as the narrowest mask that
// could hold request devices if every device of the resource, allocated and
// unhealthy ones included, were free (at most all candidates).
//
// A device counts for a mask when any of its nodes is in it, once however
// many of its nodes are. A device both reusable and available counts once,
// as reusable. IDs of allocated, reusable and held that the census does not
// know have no topology. Node ids outside 0..63 are never in a mask.
//
// Cost: a step per allocated, reusable and held device, then per mask one
// step per signature: O(a + r + h + 2^c * s) for c candidate nodes and s
// signatures, whatever the number of devices.
func (c *Census) Hints(machineNodes []int, allocated, reusable, held sets.Set[string], request int) []Hint {
	if !c.aware || len(usableNodes(machineNodes)) == 0 {
		return nil
	}
	t := c.t
	t.slots = make([]sigCount, len(c.t.slots))
	if held.Len() > 0 {
		if held.Len() != request {
			return []Hint{}
		}
		// Only the held devices are available.
		for i, s := range c.t.slots {
			t.slots[i] = sigCount{sig: s.sig, all: s.all}
		}
		for id := range held {
			if cd, ok := c.devs[id]; ok && cd.slot >= 0 {
				t.slots[cd.slot].avail++
			}
		}
		return hintsFromTally(machineNodes, &t, request)
	}
	copy(t.slots, c.t.slots)
	available := c.healthy
	isAvailable := func(cd censusDevice, id string) bool { return cd.healthy && !allocated.Has(id) }
	for id := range allocated {
		if cd, ok := c.devs[id]; ok && cd.healthy {
			available--
			if cd.slot >= 0 {
				t.slots[cd.slot].avail--
			}
		}
	}
	union := available
	for id := range reusable {
		cd, known := c.devs[id]
		if !known || !isAvailable(cd, id) {
			union++
		}
		if !known || !cd.topology {
			continue // no topology: ignored
		}
		t.reusable++
		if cd.slot < 0 {
			t.rejectAll = true
			continue
		}
		// A device both reusable and available counts once, as reusable.
		s := &t.slots[cd.slot]
		s.reusable++
		if isAvailable(cd, id) {
			s.avail--
		}
	}
	if union < request {
		return []Hint{}
	}
	return hintsFromTally(machineNodes, &t, request)
}

// hintsFromTally returns the masks Hints describes, from the counts of t:
// avail counts the available devices that are not reusable. It may modify
// t.slots.
func hintsFromTally(machineNodes []int, t *tally, request int) []Hint {
	if t.rejectAll {
		return []Hint{}
	}
	candidates := candidateNodes(machineNodes, t.nodes)

	var candMask BitMask
	for _, n := range candidates {
		candMask |= bit(n)
	}
	// Restrict signatures to the candidates: only those bits can meet a
	// mask. Signatures of reusable devices are kept apart: each must meet
	// every kept mask.
	slots := t.slots[:0]
	var pinned []BitMask
	for _, s := range t.slots {
		s.sig &= candMask
		if s.reusable > 0 {
			if s.sig == 0 {
				return []Hint{}
			}
			pinned = append(pinned, s.sig)
		}
		if s.sig != 0 {
			slots = append(slots, s)
		}
	}

	minSize := len(candidates)
	masks := make([]BitMask, 0, 1<<min(len(candidates), 16)-1)
	eachSubset(candidates, func(mask BitMask, size int) {
		all, avail := 0, 0
		for _, s := range slots {
			if s.sig&mask != 0 {
				all += s.all
				avail += s.avail
			}
		}
		if all >= request && size < minSize {
			minSize = size
		}
		if t.reusable+avail < request {
			return
		}
		for _, p := range pinned {
			if p&mask == 0 {
				return
			}
		}
		masks = append(masks, mask)
	})

	hints := make([]Hint, len(masks))
	for i := range masks {
		hints[i] = Hint{NUMANodeAffinity: &masks[i], Preferred: masks[i].Count() == minSize}
	}
	return hints
}

// candidateNodes returns deviceNUMANodes, or when it is empty the ids of
// machineNodes in 0..63 in their given order.
func candidateNodes(machineNodes []int, deviceNodes BitMask) []int {
	if c := deviceNUMANodes(machineNodes, deviceNodes); len(c) > 0 {
		return c
	}
	return usableNodes(machineNodes)
}

// deviceNUMANodes returns the ids of machineNodes that are in deviceNodes,
// ascending (the kubelet drops device nodes unknown to the machine).
func deviceNUMANodes(machineNodes []int, deviceNodes BitMask) []int {
	var machine BitMask
	for _, n := range machineNodes {
		if validNode(n) {
			machine |= bit(n)
		}
	}
	return (machine & deviceNodes).GetBits()
}
