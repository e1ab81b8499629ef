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

// AnySet reports whether any of nodes is in b; false for an empty list.
// Nodes outside 0..63 are never set.
func (b BitMask) AnySet(nodes []int) bool {
	for _, n := range nodes {
		if b.IsSet(n) {
			return true
		}
	}
	return false
}

// Count returns the number of nodes in b.
func (b BitMask) Count() int { return bits.OnesCount64(uint64(b)) }

// IsEmpty reports whether b holds no node.
func (b BitMask) IsEmpty() bool { return b == 0 }

// And returns the nodes that b and every mask of o have in common.
func (b BitMask) And(o ...BitMask) BitMask {
	for _, m := range o {
		b &= m
	}
	return b
}

// Or returns the nodes of b and of every mask of o.
func (b BitMask) Or(o ...BitMask) BitMask {
	for _, m := range o {
		b |= m
	}
	return b
}

// IsEqual reports whether b and o hold the same nodes.
func (b BitMask) IsEqual(o BitMask) bool { return b == o }

// IsNarrowerThan reports whether b holds fewer nodes than o or, with as many
// nodes, is the smaller integer (so {0} is narrower than {1}).
func (b BitMask) IsNarrowerThan(o BitMask) bool {
	if cb, co := b.Count(), o.Count(); cb != co {
		return cb < co
	}
	return b.IsLessThan(o)
}

// IsLessThan compares b and o as unsigned integers.
func (b BitMask) IsLessThan(o BitMask) bool { return b < o }

// IsGreaterThan compares b and o as unsigned integers.
func (b BitMask) IsGreaterThan(o BitMask) bool { return b > o }

// String renders b in binary, highest node first, with at least two digits:
// "00", "01", "10", "11", "101".
func (b BitMask) String() string { return fmt.Sprintf("%02b", uint64(b)) }

// IterateBitMasks calls fn with every non-empty subset of nodes: first all
// subsets of one node, then of two, and so on; subsets of one size come in
// the lexicographic order of combinations of positions in nodes (for
// [0 1 2]: {0} {1} {2} {0,1} {0,2} {1,2} {0,1,2}). Ids outside 0..63 are
// skipped, and a repeated id counts once (its first position), so every mask
// of size k holds exactly k nodes and none is produced twice.
func IterateBitMasks(nodes []int, fn func(BitMask)) {
	eachSubset(usableNodes(nodes), func(m BitMask, _ int) { fn(m) })
}

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

// eachSubset enumerates the non-empty subsets of nodes (valid and distinct)
// in the order IterateBitMasks documents, passing each mask and its size.
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
