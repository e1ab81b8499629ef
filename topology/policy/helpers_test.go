package policy

import (
	"fmt"

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
