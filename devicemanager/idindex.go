package devicemanager

import (
	"hash/maphash"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// idIndex finds a device's position in its resource's list by ID. It is an
// open-addressing table with linear probing and no keys of its own: a slot
// holds a position in the list (plus one; 0 is empty) in its low 32 bits
// and the top 32 bits of the ID's hash in its high ones, and an ID is
// compared with the device at that position only when those bits match.
// At most three slots in four are used, so 10,000 devices take 128 KiB
// where a map[string]int32 took about 500 KiB. Memory matters on the path
// of a first list: on the machine of docs/PERFORMANCE.md a page a process
// touches for the first time costs about 15 µs, and a first list of 10,000
// devices touched some 700 new pages before it became visible: about half
// of bench W1's time. The zero value is an empty index.
type idIndex struct {
	slots []uint64
}

// idSeed hashes every index's IDs; the tables are private, so one seed for
// the process is enough.
var idSeed = maphash.MakeSeed()

func idHash(id string) uint64 { return maphash.String(idSeed, id) }

// slotCount returns the table size for n devices: a power of two, at least
// 8 and at least n*4/3.
func slotCount(n int) int {
	size := 8
	for size*3 < n*4 {
		size *= 2
	}
	return size
}

// find returns the position of id in list, which the index was built for.
func (x idIndex) find(list []*pluginapi.Device, id string) (int32, bool) {
	if len(x.slots) == 0 {
		return 0, false
	}
	h := idHash(id)
	tag, mask := h>>32, uint64(len(x.slots)-1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := x.slots[i]
		if s == 0 {
			return 0, false
		}
		if s>>32 == tag {
			if p := int32(uint32(s)) - 1; list[p].ID == id {
				return p, true
			}
		}
	}
}

// insert records position p for id, the ID of list[p], and returns the
// position it replaces (the same ID listed before), or -1.
func (x idIndex) insert(list []*pluginapi.Device, id string, p int32) int32 {
	h := idHash(id)
	tag, mask := h>>32, uint64(len(x.slots)-1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := x.slots[i]
		if s == 0 {
			x.slots[i] = tag<<32 | uint64(uint32(p+1))
			return -1
		}
		if s>>32 == tag {
			if q := int32(uint32(s)) - 1; list[q].ID == id {
				x.slots[i] = tag<<32 | uint64(uint32(p+1))
				return q
			}
		}
	}
}

// indexList returns devs without nils, each ID once (the last device listed
// under it), and the index of their positions. A list nearly always names
// each device once and costs one insert per device; one that repeats an ID
// is then cut down to each ID's last device (its order matters only to an
// update in place, which such a list never gets: see inOrder) and indexed
// again.
func indexList(devs []*pluginapi.Device) (idIndex, []*pluginapi.Device) {
	list := make([]*pluginapi.Device, 0, len(devs))
	for _, d := range devs {
		if d != nil {
			list = append(list, d)
		}
	}
	index := idIndex{slots: make([]uint64, slotCount(len(list)))}
	var replaced []bool
	for p, d := range list {
		if q := index.insert(list, d.ID, int32(p)); q >= 0 {
			if replaced == nil {
				replaced = make([]bool, len(list))
			}
			replaced[q] = true
		}
	}
	if replaced == nil {
		return index, list
	}
	kept := list[:0]
	for p, d := range list {
		if !replaced[p] {
			kept = append(kept, d)
		}
	}
	clear(list[len(kept):])
	index = idIndex{slots: make([]uint64, slotCount(len(kept)))}
	for p, d := range kept {
		index.insert(kept, d.ID, int32(p))
	}
	return index, kept
}
