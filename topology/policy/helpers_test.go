package policy

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/openkubelet/devmgr/topology"
)

// mask builds a BitMask of valid nodes; a bad node is a bug in the test.
func mask(nodes ...int) topology.BitMask {
	m, err := topology.NewBitMask(nodes...)
	if err != nil {
		panic(fmt.Sprintf("test mask %v: %v", nodes, err))
	}
	return m
}

// hint returns a hint with an affinity of the given nodes.
func hint(preferred bool, nodes ...int) topology.Hint {
	m := mask(nodes...)
	return topology.Hint{NUMANodeAffinity: &m, Preferred: preferred}
}

// seqNodes returns 0..n-1.
func seqNodes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// everyMask returns every non-empty subset of the nodes 0..n-1 in the order
// topology.Census.Hints gives them: by size, and within a size by their
// lists of nodes in lexicographic order.
func everyMask(n int) []topology.BitMask {
	masks := make([]topology.BitMask, 0, 1<<n-1)
	for m := topology.BitMask(1); m < 1<<n; m++ {
		masks = append(masks, m)
	}
	slices.SortFunc(masks, func(a, b topology.BitMask) int {
		return cmp.Or(cmp.Compare(a.Count(), b.Count()), slices.Compare(a.GetBits(), b.GetBits()))
	})
	return masks
}
