package topology

import (
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The reference: the kubelet's hint generation and tiering written out
// plainly, with devmgr's readings of what the kubelet leaves open (see the
// package documentation). It examines every device for every mask and keeps
// nothing between calls; the tests hold the Census to it.

// hintQuery is one question to Census.Hints together with the devices the
// census counts: all the reference needs to answer it from scratch.
type hintQuery struct {
	machine   []int
	devices   map[string]*pluginapi.Device
	healthy   sets.Set[string]
	allocated sets.Set[string]
	reusable  sets.Set[string] // nil at pod scope
	held      sets.Set[string]
	request   int
}

// census counts the devices of q.
func (q hintQuery) census() *Census {
	return CountDevices(maps.All(q.devices), len(q.devices), q.healthy.Has)
}

// censusHints asks q of a census of its devices.
func (q hintQuery) censusHints() []Hint {
	return q.census().Hints(q.machine, q.allocated, q.reusable, q.held, q.request)
}

// nodeIDs is the kubelet's getNUMANodeIds: nil for no topology, else every
// listed id (nil entries skipped), whatever its range.
func nodeIDs(d *pluginapi.Device) []int {
	if d == nil || d.Topology == nil {
		return nil
	}
	ids := []int{}
	for _, n := range d.Topology.Nodes {
		if n != nil {
			ids = append(ids, int(n.ID))
		}
	}
	return ids
}

// aware reports whether some device lists a node id, whatever its range.
func aware(devices map[string]*pluginapi.Device) bool {
	for _, d := range devices {
		if len(nodeIDs(d)) > 0 {
			return true
		}
	}
	return false
}

// touches reports whether some node id of d is in m (ids outside 0..63
// never are).
func touches(m BitMask, d *pluginapi.Device) bool {
	return slices.ContainsFunc(nodeIDs(d), m.IsSet)
}

// subsets lists the non-empty subsets of nodes by size, each size in
// lexicographic order of combinations of positions, by plain recursion.
func subsets(nodes []int) []BitMask {
	var out []BitMask
	var pick func(start, size int, chosen BitMask)
	pick = func(start, size int, chosen BitMask) {
		if size == 0 {
			out = append(out, chosen)
			return
		}
		for i := start; i < len(nodes); i++ {
			pick(i+1, size-1, chosen|BitMask(1)<<nodes[i])
		}
	}
	for size := 1; size <= len(nodes); size++ {
		pick(0, size, 0)
	}
	return out
}

// referenceHints answers q as the kubelet's GetTopologyHints (and, with no
// reuse pool, GetPodTopologyHints) decides per resource: no preference,
// nothing possible, or the masks of referenceMasks.
func referenceHints(q hintQuery) []Hint {
	var machine []int // ids in 0..63, each once, in the given order
	for _, n := range q.machine {
		if n >= 0 && n <= 63 && !slices.Contains(machine, n) {
			machine = append(machine, n)
		}
	}
	if !aware(q.devices) || len(machine) == 0 {
		return nil
	}
	if q.held.Len() > 0 {
		if q.held.Len() != q.request {
			return []Hint{}
		}
		return referenceMasks(machine, q.devices, q.held, nil, q.request)
	}
	available := sets.New[string]()
	for id := range q.devices {
		if q.healthy.Has(id) && !q.allocated.Has(id) {
			available.Insert(id)
		}
	}
	if available.Union(q.reusable).Len() < q.request {
		return []Hint{}
	}
	return referenceMasks(machine, q.devices, available, q.reusable, q.request)
}

// referenceMasks is the kubelet's generateDeviceTopologyHints on a machine
// of the given nodes (in 0..63, each once): for every subset of the nodes
// that carry devices (or of all machine nodes when none does), count the
// devices with a node in it. A device both reusable and available counts
// once, as reusable; an ID that is not a device has no topology.
func referenceMasks(machine []int, devices map[string]*pluginapi.Device,
	available, reusable sets.Set[string], request int) []Hint {
	var candidates []int
	for _, n := range machine {
		for _, d := range devices {
			if slices.Contains(nodeIDs(d), n) {
				candidates = append(candidates, n)
				break
			}
		}
	}
	slices.Sort(candidates)
	if len(candidates) == 0 {
		candidates = machine
	}

	minSize := len(candidates)
	hints := []Hint{}
	for _, m := range subsets(candidates) {
		inMask := 0
		for _, d := range devices {
			if touches(m, d) {
				inMask++
			}
		}
		if inMask >= request && m.Count() < minSize {
			minSize = m.Count()
		}
		matching, rejected := 0, false
		for id := range reusable {
			d := devices[id]
			if d == nil || d.Topology == nil {
				continue
			}
			if !touches(m, d) {
				rejected = true
				break
			}
			matching++
		}
		if rejected {
			continue
		}
		for id := range available {
			if !reusable.Has(id) && touches(m, devices[id]) {
				matching++
			}
		}
		if matching >= request {
			hints = append(hints, Hint{NUMANodeAffinity: &m})
		}
	}
	for i := range hints {
		hints[i].Preferred = hints[i].NUMANodeAffinity.Count() == minSize
	}
	return hints
}

// referenceTiers is the documentation of Census.Tiers taken literally, with
// maps and a stable sort, for the available devices (IDs that are not
// devices included).
func referenceTiers(affinity *BitMask, devices map[string]*pluginapi.Device, available sets.Set[string]) Tiers {
	ids := sets.List(available)
	if affinity == nil || !aware(devices) {
		var t Tiers
		t.NoTopology = append(t.NoTopology, ids...) // nil if none
		return t
	}
	nodesOf := map[string][]int{}
	count := map[int]int{} // available devices per node
	for _, id := range ids {
		for _, n := range nodeIDs(devices[id]) {
			if n >= 0 && n <= 63 && !slices.Contains(nodesOf[id], n) {
				nodesOf[id] = append(nodesOf[id], n)
				count[n]++
			}
		}
	}
	// The walk: nodes of the affinity first, then by available devices,
	// then by number.
	walk := slices.Collect(maps.Keys(count))
	key := func(n int) []int {
		outside := 1
		if affinity.IsSet(n) {
			outside = 0
		}
		return []int{outside, count[n], n}
	}
	slices.SortFunc(walk, func(a, b int) int { return slices.Compare(key(a), key(b)) })
	place := map[int]int{}
	inMask := 0
	for i, n := range walk {
		place[n] = i
		if affinity.IsSet(n) {
			inMask++
		}
	}
	// A device goes under the first of its nodes in the walk.
	rank := func(id string) int {
		r := len(walk)
		for _, n := range nodesOf[id] {
			r = min(r, place[n])
		}
		return r
	}
	slices.SortStableFunc(ids, func(a, b string) int { return rank(a) - rank(b) })
	var t Tiers
	for _, id := range ids {
		switch r := rank(id); {
		case r < inMask:
			t.Aligned = append(t.Aligned, id)
		case r < len(walk):
			t.Unaligned = append(t.Unaligned, id)
		default:
			t.NoTopology = append(t.NoTopology, id)
		}
	}
	return t
}
