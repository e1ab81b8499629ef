package topology

import (
	"iter"
	"math/bits"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Census keeps, for one resource, what its topology hints (Hints) and tiers
// (Tiers) need to know of its devices: the devices per distinct node set
// ("signature"), all of them and the healthy ones, and the signature and
// health of each device. It is built with one pass over the devices when
// their list or health changes; Hints then costs one step per mask and
// signature plus the allocated, reusable and held devices, not a pass over
// every device.
//
// A Census does not change once built; it keeps what it needs of the
// devices, not the devices.
type Census struct {
	t     tally // all counts, and healthy counts in avail; never reusable
	aware bool  // some device reports a node (hasNode)
	// devs holds, per device ID, its signature slot and whether it is
	// healthy.
	devs    map[string]censusDevice
	healthy int // healthy devices, with a signature or not
}

type censusDevice struct {
	slot     int32 // index in t.slots; -1 without a signature
	healthy  bool
	topology bool // the device has a topology, possibly of no node
}

// CountDevices counts devices, given as pairs of an ID and its device, each
// ID once; n is about how many (room is made for that many), and healthy
// tells which are healthy. A nil device has no topology.
func CountDevices(devices iter.Seq2[string, *pluginapi.Device], n int, healthy func(id string) bool) *Census {
	c := &Census{devs: make(map[string]censusDevice, n)}
	for id, d := range devices {
		sig, hasTopology := signature(d)
		cd := censusDevice{slot: -1, healthy: healthy(id), topology: hasTopology}
		if sig != 0 {
			i := c.t.slotIndex(sig)
			c.t.slots[i].all++
			if cd.healthy {
				c.t.slots[i].avail++
			}
			cd.slot = int32(i)
		}
		if cd.healthy {
			c.healthy++
		}
		c.aware = c.aware || hasNode(d)
		c.devs[id] = cd
	}
	return c
}

// hasNode reports whether d's topology names a node: any id counts, even
// one outside 0..63 or unknown to the machine, as in the kubelet; a nil
// entry of the node list does not.
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

// signature returns the mask of d's NUMA node ids that lie in 0..63, and
// whether d has a Topology at all (a nil device has none; nil entries of the
// node list are skipped).
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

// sigCount counts the devices of one signature.
type sigCount struct {
	sig      BitMask
	all      int // devices of the resource
	avail    int // available and not reusable
	reusable int // reusable, with a Topology
}

// tally holds the counts per signature that hint generation reads.
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

// slotIndex returns the index of sig's slot in t.slots (sig not empty),
// adding one if needed.
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
