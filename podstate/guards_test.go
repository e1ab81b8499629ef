package podstate

// The tests in this file came from a mutation sweep of the package: each
// fails when one guard or state update it names is changed, where no other
// test did.

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/openkubelet/devmgr/topology"
)

// TestQueryListsRepeatedUnsortedAlignedOnce: select.go freeAligned returns "the free aligned devices, each once",
// also for an aligned tier not in ID order with a repeat.
func TestQueryListsRepeatedUnsortedAlignedOnce(t *testing.T) {
	in := SelectInput{Resource: "r", Required: 1, Needed: 1,
		Available: sets.New("a", "b", "c"), Tiers: topology.Tiers{Aligned: []string{"b", "a", "b"}, Unaligned: []string{"c"}}}
	q, ask := PreferredQueryFor(in)
	require.True(t, ask)
	assert.Equal(t, []string{"a", "b"}, q.Available)
}
