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
// (plugins name their devices alike: "GPU-", "nvidia", "dev-"), the next 12
// bytes make a key, the keys are sorted a byte at a time, and the few IDs
// whose keys tie are compared whole. A list already in order is not sorted.
// The IDs are sorted where they are, in the copy the caller hands over:
// besides that copy and the order it returns, the sort needs two arrays of
// 16-byte keys and a bit per device, and keeps none of them.
const radixMin = 256

// deviceIDs copies the IDs of list.
func deviceIDs(list []*pluginapi.Device) []string {
	out := make([]string, len(list))
	for i, d := range list {
		out[i] = d.ID
	}
	return out
}

// sortByID sorts ids, which the caller hands over, and returns it with the
// index each ID had (for equal IDs, in no particular order). It reads
// nothing shared, so it runs outside the manager's lock.
func sortByID(ids []string) (order []int32, sorted []string) {
	order = make([]int32, len(ids))
	// Many plugins list their devices in order already; checking costs a
	// comparison or two when they do not.
	if slices.IsSorted(ids) {
		for k := range order {
			order[k] = int32(k)
		}
		return order, ids
	}
	if len(ids) >= radixMin {
		radixOrder(ids, order)
	} else {
		for k := range order {
			order[k] = int32(k)
		}
		slices.SortFunc(order, func(a, b int32) int { return strings.Compare(ids[a], ids[b]) })
	}
	permute(ids, order)
	return order, ids
}

// permute rearranges ids so that ids[k] becomes what ids[order[k]] was;
// order is a permutation. Each cycle of order is followed once, with a bit
// per ID to mark the places done.
func permute(ids []string, order []int32) {
	done := make([]uint64, (len(ids)+63)/64)
	for start := range ids {
		if done[start/64]&(1<<(start%64)) != 0 {
			continue
		}
		first := ids[start]
		k := start
		for {
			done[k/64] |= 1 << (k % 64)
			next := int(order[k])
			if next == start {
				ids[k] = first
				break
			}
			ids[k] = ids[next]
			k = next
		}
	}
}

// radixKey is the 12 bytes of an ID after the common prefix, zero-padded,
// as two big-endian words, and the ID's index. Keys in increasing order are
// IDs in increasing order, apart from ties.
type radixKey struct {
	hi uint64
	lo uint32
	at int32
}

// radixKeyBytes is how many bytes of an ID a radixKey holds.
const radixKeyBytes = 12

// radixOrder writes into order the indices of ids in ID order: an LSD
// radix sort of the keys, a byte at a time and skipping the bytes all keys
// share, then a comparison sort of each run of tied keys.
func radixOrder(ids []string, order []int32) {
	skip := commonPrefixLen(ids)
	keys, spare := make([]radixKey, len(ids)), make([]radixKey, len(ids))
	for k, id := range ids {
		var b [radixKeyBytes]byte
		if skip < len(id) {
			copy(b[:], id[skip:])
		}
		keys[k] = radixKey{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint32(b[8:]), int32(k)}
	}
	for pass := range radixKeyBytes {
		if radixPass(keys, spare, pass) {
			keys, spare = spare, keys
		}
	}
	for k, key := range keys {
		order[k] = key.at
	}
	byID := func(a, b int32) int { return strings.Compare(ids[a], ids[b]) }
	for a := 0; a < len(keys); {
		b := a + 1
		for b < len(keys) && keys[b].hi == keys[a].hi && keys[b].lo == keys[a].lo {
			b++
		}
		if b-a > 1 {
			slices.SortFunc(order[a:b], byID)
		}
		a = b
	}
}

// radixPass distributes keys into out by their byte number pass, counted
// from the least significant; false, leaving out alone, when every key has
// the same byte there.
func radixPass(keys, out []radixKey, pass int) bool {
	hi := pass >= 4
	shift := uint(pass) * 8
	if hi {
		shift = uint(pass-4) * 8
	}
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

// commonPrefixLen returns the length of the prefix all of ids share (not
// empty).
func commonPrefixLen(ids []string) int {
	first := ids[0]
	n := len(first)
	for _, id := range ids[1:] {
		n = min(n, len(id))
		for j := range n {
			if id[j] != first[j] {
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
