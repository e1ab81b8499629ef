package topology

import (
	"math/bits"

	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// HintRequest is what ResourceHints needs to know about one resource of one
// container (container scope) or one pod (pod scope).
type HintRequest struct {
	// MachineNodes are the machine's NUMA node ids (Discover's result).
	MachineNodes []int
	// Devices are all devices of the resource, healthy or not, by ID.
	Devices map[string]*pluginapi.Device
	// Available are the healthy devices not allocated to anyone.
	Available sets.Set[string]
	// Reusable is the reuse pool: devices regular init containers of the pod
	// hold and later containers may take (container scope); nil at pod scope.
	Reusable sets.Set[string]
	// Held are the devices the container (or, at pod scope, the pod) already
	// holds; nil or empty if none.
	Held sets.Set[string]
	// Request is the number of devices asked for.
	Request int
}

// ResourceHints returns the topology hints of one resource, as the kubelet's
// GetTopologyHints (container scope) and GetPodTopologyHints (pod scope) do:
//   - nil (no preference) when the resource is not topology-aware (Aware),
//     or when MachineNodes holds no id in 0..63 (a machine without NUMA
//     information);
//   - when Held is not empty: an empty non-nil slice if its size differs from
//     Request, else the hints of exactly the held devices (no reuse pool);
//   - otherwise an empty non-nil slice (nothing can satisfy the request) when
//     Available and Reusable together hold fewer than Request devices, else
//     GenerateHints over Available and Reusable.
func ResourceHints(r HintRequest) []Hint {
	if !Aware(r.Devices) || len(usableNodes(r.MachineNodes)) == 0 {
		return nil
	}
	if r.Held.Len() > 0 {
		if r.Held.Len() != r.Request {
			return []Hint{}
		}
		return GenerateHints(r.MachineNodes, r.Devices, r.Held, nil, r.Request)
	}
	if unionLen(r.Available, r.Reusable) < r.Request {
		return []Hint{}
	}
	return GenerateHints(r.MachineNodes, r.Devices, r.Available, r.Reusable, r.Request)
}

// Aware reports whether a resource is topology-aware: some device of it
// reports at least one NUMA node. Any id counts, even one outside 0..63 or unknown to the machine, as in the
// kubelet; nil Topology, an empty node list and nil list entries do not.
func Aware(devices map[string]*pluginapi.Device) bool {
	for _, d := range devices {
		if hasNode(d) {
			return true
		}
	}
	return false
}

// hasNode reports whether d's topology names a node.
func hasNode(d *pluginapi.Device) bool {
	if d == nil || d.Topology == nil {
		return false
	}
	for _, n := range d.Topology.Nodes {
		if n != nil {
			return true
		}
	}
	return false
}

// GenerateHints enumerates the NUMA masks that can hold request devices of a
// resource (the kubelet's generateDeviceTopologyHints). It always
// returns a non-nil slice, empty when no mask fits.
//
// Candidate nodes are the NUMA nodes any device reports (healthy or not) that
// machineNodes also lists, ascending; when there are none, machineNodes in
// their given order. Every non-empty subset of the candidates is tried, in
// IterateBitMasks order, which is also the order of the result. A mask is
// kept when no reusable device with a Topology lies wholly outside it (such
// a device, even one with an empty node list, rejects the mask; one with nil
// Topology is ignored) and the reusable devices with a Topology plus the
// available devices with a node in the mask number at least request. A kept
// mask is Preferred when it has as few nodes as the narrowest mask that
// could hold request devices if every device of the resource, allocated and
// unhealthy ones included, were free (at most all candidates).
//
// A device counts for a mask when any of its nodes is in it, once however
// many of its nodes are. IDs of available or reusable that are not keys of
// devices have no topology; a device both reusable and available counts once,
// as reusable. Node ids outside 0..63 are never in a mask.
//
// Cost: one pass over devices, then per mask one step per distinct node set
// ("signature") of the devices: O(len(devices) + 2^c * s) for c candidate
// nodes and s signatures, whatever the number of devices.
func GenerateHints(machineNodes []int, devices map[string]*pluginapi.Device,
	available, reusable sets.Set[string], request int) []Hint {
	return hintsFromTally(machineNodes, tallyDevices(devices, available, reusable), request)
}

// hintsFromTally is GenerateHints once the devices are counted.
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

// sigCount counts the devices of one signature: the set of their NUMA nodes
// (ids in 0..63).
type sigCount struct {
	sig      BitMask
	all      int // devices of the resource
	avail    int // available and not reusable
	reusable int // reusable, with a Topology
}

// tally is the result of the single pass over a resource's devices.
type tally struct {
	slots  []sigCount      // one per distinct non-empty signature
	single [64]int32       // slot index+1 of each single-node signature
	multi  map[BitMask]int // slot index of each multi-node signature
	nodes  BitMask         // union of all signatures
	// reusable counts reusable devices with a Topology.
	reusable int
	// rejectAll is set by a reusable device with a Topology but no node
	// in 0..63: it lies outside every mask.
	rejectAll bool
}

// tallyDevices makes the one pass over devices that hint generation needs.
func tallyDevices(devices map[string]*pluginapi.Device, available, reusable sets.Set[string]) *tally {
	t := &tally{}
	for id, d := range devices {
		sig, hasTopology := signature(d)
		isReusable := hasTopology && len(reusable) > 0 && reusable.Has(id)
		if isReusable {
			t.reusable++
			if sig == 0 {
				t.rejectAll = true
			}
		}
		if sig == 0 {
			continue
		}
		s := t.slot(sig)
		s.all++
		switch {
		case isReusable:
			s.reusable++
		case len(available) > 0 && available.Has(id):
			s.avail++
		}
	}
	return t
}

// slot returns the counters of sig (not empty), adding them if new. The
// pointer is valid until the next call.
func (t *tally) slot(sig BitMask) *sigCount { return &t.slots[t.slotIndex(sig)] }

// slotIndex returns the index of sig's slot in t.slots, adding one if needed.
func (t *tally) slotIndex(sig BitMask) int {
	if sig&(sig-1) == 0 {
		n := bits.TrailingZeros64(uint64(sig))
		if i := t.single[n]; i != 0 {
			return int(i - 1)
		}
		t.slots = append(t.slots, sigCount{sig: sig})
		t.single[n] = int32(len(t.slots))
	} else {
		if i, ok := t.multi[sig]; ok {
			return i
		}
		if t.multi == nil {
			t.multi = make(map[BitMask]int)
		}
		t.slots = append(t.slots, sigCount{sig: sig})
		t.multi[sig] = len(t.slots) - 1
	}
	t.nodes |= sig
	return len(t.slots) - 1
}

// signature returns the mask of d's NUMA node ids that lie in 0..63, and
// whether d has a Topology at all (a missing device has none; nil entries of
// the node list are skipped).
func signature(d *pluginapi.Device) (BitMask, bool) {
	if d == nil || d.Topology == nil {
		return 0, false
	}
	var m BitMask
	for _, n := range d.Topology.Nodes {
		if n != nil && n.ID >= 0 && n.ID <= maxNode {
			m |= bit(int(n.ID))
		}
	}
	return m, true
}

// unionLen returns |a ∪ b|.
func unionLen(a, b sets.Set[string]) int {
	n := len(a)
	for id := range b {
		if !a.Has(id) {
			n++
		}
	}
	return n
}
