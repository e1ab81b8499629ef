package topology

import (
	"iter"
	"maps"

	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Census keeps, for one resource, the counts hint generation needs: devices
// per distinct node set ("signature"), all of them and those available. It
// is built with one pass over the devices when their list changes; marking a
// device available or not (SetAvailable, as allocations come and go) is O(1),
// and Hints costs one step per mask and signature plus the reusable and held
// devices — not a pass over every device. Its answers are those of
// ResourceHints over the same devices and available set.
//
// A Census is a value owned by its caller and is not safe for concurrent
// use. It keeps what it needs of the devices, not the devices.
type Census struct {
	t     tally // all and avail counts; never reusable
	aware bool
	// devs holds, per device ID, its signature slot and whether it is
	// available.
	devs      map[string]censusDevice
	available int // available devices, with a signature or not
}

type censusDevice struct {
	slot      int32 // index in t.slots; -1 without a signature
	available bool
	topology  bool // the device has a topology, possibly of no node
}

// NewCensus counts devices; available tells which are available (healthy and
// not allocated).
func NewCensus(devices map[string]*pluginapi.Device, available func(id string) bool) *Census {
	return CountDevices(maps.All(devices), len(devices), available)
}

// CountDevices is NewCensus for devices given as pairs of an ID and its
// device, each ID once; n is about how many (room is made for that many).
func CountDevices(devices iter.Seq2[string, *pluginapi.Device], n int, available func(id string) bool) *Census {
	c := &Census{devs: make(map[string]censusDevice, n)}
	for id, d := range devices {
		sig, hasTopology := signature(d)
		cd := censusDevice{slot: -1, available: available(id), topology: hasTopology}
		if sig != 0 {
			i := c.t.slotIndex(sig)
			c.t.slots[i].all++
			cd.slot = int32(i)
		}
		c.aware = c.aware || hasNode(d)
		c.devs[id] = cd
	}
	for id, cd := range c.devs {
		if cd.available {
			c.setAvailable(id, cd, true)
		}
	}
	return c
}

func (c *Census) setAvailable(id string, cd censusDevice, available bool) {
	delta := 1
	if !available {
		delta = -1
	}
	if cd.slot >= 0 {
		c.t.slots[cd.slot].avail += delta
	}
	c.available += delta
	cd.available = available
	c.devs[id] = cd
}

// SetAvailable records that the device became available or stopped being
// so. Unknown IDs are ignored.
func (c *Census) SetAvailable(id string, available bool) {
	if cd, ok := c.devs[id]; ok && cd.available != available {
		c.setAvailable(id, cd, available)
	}
}

// Available returns the number of available devices.
func (c *Census) Available() int { return c.available }

// IsAvailable reports whether the device is available; false for an
// unknown ID.
func (c *Census) IsAvailable(id string) bool { return c.devs[id].available }

// Hints returns what ResourceHints returns for these devices and the
// census's available devices, with reusable and held as in HintRequest.
func (c *Census) Hints(machineNodes []int, reusable, held sets.Set[string], request int) []Hint {
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
	union := c.available
	for id := range reusable {
		cd, known := c.devs[id]
		if !known || !cd.available {
			union++
		}
		if !known {
			continue // no topology: ignored
		}
		if !cd.topology {
			continue
		}
		t.reusable++
		if cd.slot < 0 {
			t.rejectAll = true
			continue
		}
		// A device both reusable and available counts once, as reusable.
		s := &t.slots[cd.slot]
		s.reusable++
		if cd.available {
			s.avail--
		}
	}
	if union < request {
		return []Hint{}
	}
	return hintsFromTally(machineNodes, &t, request)
}
