package topology

import (
	"errors"
	"fmt"
	"math/bits"
)

// maxNode is the largest NUMA node id a BitMask can hold.
const maxNode = 63

// ErrBitOutOfRange is returned by NewBitMask for a node id outside 0..63.
// Its text is the kubelet's.
var ErrBitOutOfRange = errors.New("bit number must be in range 0-63")

// BitMask is a set of NUMA node ids: bit i set means node i (0..63).
// It is a plain value; the zero value is the empty set.
type BitMask uint64

// NewBitMask returns the mask of the given nodes. A node outside 0..63 makes
// it fail with ErrBitOutOfRange and return the empty mask (never a partial one).
func NewBitMask(nodes ...int) (BitMask, error) {
	var m BitMask
	for _, n := range nodes {
		if !validNode(n) {
			return 0, ErrBitOutOfRange
		}
		m |= bit(n)
	}
	return m, nil
}

// validNode reports whether n can be held by a BitMask.
func validNode(n int) bool { return n >= 0 && n <= maxNode }

// bit returns the single-node mask of n, which must be valid.
func bit(n int) BitMask { return BitMask(1) << uint(n) }

// GetBits returns the nodes of b in ascending order; nil for the empty mask.
func (b BitMask) GetBits() []int {
	if b == 0 {
		return nil
	}
	out := make([]int, 0, b.Count())
	for rest := uint64(b); rest != 0; rest &= rest - 1 {
		out = append(out, bits.TrailingZeros64(rest))
	}
	return out
}

// IsSet reports whether node is in b; false for a node outside 0..63.
func (b BitMask) IsSet(node int) bool {
	return validNode(node) && b&bit(node) != 0
}

// Count returns the number of nodes in b.
func (b BitMask) Count() int { return bits.OnesCount64(uint64(b)) }

// IsEmpty reports whether b holds no node.
func (b BitMask) IsEmpty() bool { return b == 0 }

// IsNarrowerThan reports whether b holds fewer nodes than o or, with as many
// nodes, is the smaller integer (so {0} is narrower than {1}).
func (b BitMask) IsNarrowerThan(o BitMask) bool {
	if cb, co := b.Count(), o.Count(); cb != co {
		return cb < co
	}
	return b < o
}

// String renders b in binary, highest node first, with at least two digits:
// "00", "01", "10", "11", "101".
func (b BitMask) String() string { return fmt.Sprintf("%02b", uint64(b)) }

// usableNodes returns nodes without ids outside 0..63 and without repeats,
// keeping the order of first appearance. It returns nodes itself when there
// is nothing to drop.
func usableNodes(nodes []int) []int {
	var seen BitMask
	for i, n := range nodes {
		if !validNode(n) || seen&bit(n) != 0 {
			out := make([]int, i, len(nodes))
			copy(out, nodes[:i])
			for _, n := range nodes[i:] {
				if validNode(n) && seen&bit(n) == 0 {
					seen |= bit(n)
					out = append(out, n)
				}
			}
			return out
		}
		seen |= bit(n)
	}
	return nodes
}

// eachSubset calls fn with every non-empty subset of nodes (ids in 0..63,
// each once) and its size: first all subsets of one node, then of two, and
// so on; subsets of one size come in the lexicographic order of combinations
// of positions in nodes (for [0 1 2]: {0} {1} {2} {0,1} {0,2} {1,2}
// {0,1,2}). This is the order of the kubelet's IterateBitMasks, and so of
// hints.
func eachSubset(nodes []int, fn func(mask BitMask, size int)) {
	n := len(nodes)
	idx := make([]int, n)
	for size := 1; size <= n; size++ {
		for i := range size {
			idx[i] = i
		}
		for {
			var m BitMask
			for _, p := range idx[:size] {
				m |= bit(nodes[p])
			}
			fn(m, size)
			// Advance to the next combination: bump the rightmost position
			// that still has room, and pack the ones after it behind it.
			i := size - 1
			for i >= 0 && idx[i] == n-size+i {
				i--
			}
			if i < 0 {
				break
			}
			idx[i]++
			for j := i + 1; j < size; j++ {
				idx[j] = idx[j-1] + 1
			}
		}
	}
}
