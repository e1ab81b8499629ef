package devicemanager

import (
	"encoding/binary"
	"slices"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// A plugin's first list, and any list with new IDs, is sorted by ID for the
// checkpoint. Comparison sorting 10,000 GPU UUIDs in no order takes 1.3 ms,
// most of it in comparisons that reread the IDs' bytes; past radixMin IDs,
// sortByID radix-sorts instead (0.5 ms): the IDs' common prefix is skipped
// (plugins name their devices alike: "GPU-", "nvidia", "dev-"), the next 16
// bytes make a key, the keys are sorted a byte at a time, and the few IDs
// whose keys tie are compared whole. A list already in order is not sorted.
const radixMin = 256

// idAt is a device ID and its index in a device list.
type idAt struct {
	id string
	i  int32
}

// idsAt copies the IDs of list, with their indices.
func idsAt(list []*pluginapi.Device) []idAt {
	out := make([]idAt, len(list))
	for i, d := range list {
		out[i] = idAt{d.ID, int32(i)}
	}
	return out
}

// sortByID returns the indices and the IDs of byID, in ID order (for equal
// IDs, in no particular order). It may reorder byID, and it reads nothing
// shared, so it runs outside the manager's lock.
func sortByID(byID []idAt) (order []int32, ids []string) {
	// Many plugins list their devices in order already; checking costs a
	// comparison or two when they do not.
	if !slices.IsSortedFunc(byID, compareIDAt) {
		if len(byID) >= radixMin {
			return radixSortIDs(byID)
		}
		slices.SortFunc(byID, compareIDAt)
	}
	order, ids = make([]int32, len(byID)), make([]string, len(byID))
	for k, x := range byID {
		order[k], ids[k] = x.i, x.id
	}
	return order, ids
}

func compareIDAt(a, b idAt) int { return strings.Compare(a.id, b.id) }

// radixKey is the 16 bytes of an ID after the common prefix, zero-padded,
// as two big-endian words, and where the ID is in the slice being sorted.
// Keys in increasing order are IDs in increasing order, apart from ties.
type radixKey struct {
	hi, lo uint64
	at     int32
}

// radixSortIDs is sortByID by an LSD radix sort of the keys, a byte at a
// time and skipping the bytes all keys share, then a comparison sort of
// each run of tied keys.
func radixSortIDs(byID []idAt) (order []int32, ids []string) {
	skip := commonPrefixLen(byID)
	keys, spare := make([]radixKey, len(byID)), make([]radixKey, len(byID))
	for k, x := range byID {
		var b [16]byte
		if skip < len(x.id) {
			copy(b[:], x.id[skip:])
		}
		keys[k] = radixKey{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:]), int32(k)}
	}
	for pass := range 16 {
		if radixPass(keys, spare, pass) {
			keys, spare = spare, keys
		}
	}
	order, ids = make([]int32, len(byID)), make([]string, len(byID))
	for k, key := range keys {
		x := byID[key.at]
		order[k], ids[k] = x.i, x.id
	}
	for a := 0; a < len(keys); {
		b := a + 1
		for b < len(keys) && keys[b].hi == keys[a].hi && keys[b].lo == keys[a].lo {
			b++
		}
		if b-a > 1 {
			tied := make([]idAt, 0, b-a)
			for k := a; k < b; k++ {
				tied = append(tied, idAt{ids[k], order[k]})
			}
			slices.SortFunc(tied, compareIDAt)
			for k, x := range tied {
				order[a+k], ids[a+k] = x.i, x.id
			}
		}
		a = b
	}
	return order, ids
}

// radixPass distributes keys into out by their byte number pass, counted
// from the least significant; false, leaving out alone, when every key has
// the same byte there.
func radixPass(keys, out []radixKey, pass int) bool {
	shift, hi := uint(pass%8)*8, pass >= 8
	digit := func(k *radixKey) byte {
		if hi {
			return byte(k.hi >> shift)
		}
		return byte(k.lo >> shift)
	}
	var start [256]int
	for i := range keys {
		start[digit(&keys[i])]++
	}
	if start[digit(&keys[0])] == len(keys) {
		return false
	}
	sum := 0
	for d, n := range start {
		start[d] = sum
		sum += n
	}
	for i := range keys {
		d := digit(&keys[i])
		out[start[d]] = keys[i]
		start[d]++
	}
	return true
}

// commonPrefixLen returns the length of the prefix all IDs of byID share
// (not empty).
func commonPrefixLen(byID []idAt) int {
	first := byID[0].id
	n := len(first)
	for _, x := range byID[1:] {
		n = min(n, len(x.id))
		for j := range n {
			if x.id[j] != first[j] {
				n = j
				break
			}
		}
		if n == 0 {
			break
		}
	}
	return n
}
