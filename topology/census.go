package topology

import (
	"iter"

	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Census keeps, for one resource, the counts hint generation needs: devices
// per distinct node set ("signature"), all of them and the healthy ones. It
// is built with one pass over the devices when their list or health changes;
// Hints then costs one step per mask and signature plus the allocated,
// reusable and held devices, not a pass over every device. Its answers are
// those of ResourceHints over the same devices, with the healthy devices not
// allocated as the available ones.
//
// A Census does not change once built; it keeps what it needs of the
// devices, not the devices.
type Census struct {
	t     tally // all counts, and healthy counts in avail; never reusable
	aware bool
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
// tells which are healthy.
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

// Hints returns what ResourceHints returns for these devices with the
// healthy devices that allocated does not hold as the available ones, and
// with reusable and held as in HintRequest.
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
