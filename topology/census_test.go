package topology

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// A Census of the healthy devices answers, for any set of allocated devices,
// what ResourceHints answers with the healthy devices not allocated as the
// available ones, on the cross-check's random resources.
func TestCensusMatchesResourceHints(t *testing.T) {
	const rounds = 3000
	withHints := 0
	for seed := range uint64(rounds) {
		rng := rand.New(rand.NewPCG(seed, 7))
		r := randomRequest(rng)
		// The healthy devices are devices of the resource.
		healthy := sets.New[string]()
		for id := range r.Available {
			if _, ok := r.Devices[id]; ok {
				healthy.Insert(id)
			}
		}
		c := CountDevices(maps.All(r.Devices), len(r.Devices), healthy.Has)
		for step := range 4 {
			// Some devices are allocated: healthy ones, unhealthy ones and
			// IDs the census does not know.
			allocated := someOf(rng, sets.KeySet(r.Devices).Insert("ghost-never-listed"))
			r.Available = healthy.Difference(allocated)
			want := ResourceHints(r)
			got := c.Hints(r.MachineNodes, allocated, r.Reusable, r.Held, r.Request)
			require.Equal(t, want == nil, got == nil, "seed %d step %d nil-ness: %s", seed, step, describe(r))
			require.Equal(t, want, got, "seed %d step %d: %s", seed, step, describe(r))
			if len(got) > 0 {
				withHints++
			}
		}
	}
	assert.Greater(t, withHints, rounds, "rounds with hints")
}

// someOf returns about a quarter of ids.
func someOf(rng *rand.Rand, ids sets.Set[string]) sets.Set[string] {
	out := sets.New[string]()
	for _, id := range sets.List(ids) {
		if rng.IntN(4) == 0 {
			out.Insert(id)
		}
	}
	return out
}

func BenchmarkCensusHints(b *testing.B) {
	devices := deviceMap()
	for i := range 10000 {
		id := string(rune('a'+i%26)) + string(rune('0'+i%10)) + string(rune(i))
		devices[id] = numaDev(id, int64(i%2))
	}
	available := sets.KeySet(devices)
	c := CountDevices(maps.All(devices), len(devices), available.Has)
	b.ReportAllocs()
	for b.Loop() {
		c.Hints([]int{0, 1}, nil, nil, nil, 4)
	}
}

// tiersByDefinition is FilterByAffinity's documentation taken literally,
// with maps and a stable sort: the reference for the one-pass versions.
func tiersByDefinition(affinity *BitMask, devices map[string]*pluginapi.Device, available sets.Set[string]) Tiers {
	ids := sets.List(available)
	if affinity == nil || !Aware(devices) {
		return Tiers{NoTopology: nilIfEmpty(ids)}
	}
	nodesOf := map[string][]int{}
	count := map[int]int{} // available devices per node
	for _, id := range ids {
		if sig, ok := signature(devices[id]); ok {
			for n := range maxNode + 1 {
				if sig.IsSet(n) {
					nodesOf[id] = append(nodesOf[id], n)
					count[n]++
				}
			}
		}
	}
	// The walk: nodes of the affinity first, then by available devices,
	// then by number.
	walk := slices.Collect(maps.Keys(count))
	key := func(n int) []int {
		outside := 1
		if affinity.IsSet(n) {
			outside = 0
		}
		return []int{outside, count[n], n}
	}
	slices.SortFunc(walk, func(a, b int) int { return slices.Compare(key(a), key(b)) })
	place := map[int]int{}
	inMask := 0
	for i, n := range walk {
		place[n] = i
		if affinity.IsSet(n) {
			inMask++
		}
	}
	// A device goes under the first of its nodes in the walk.
	rank := func(id string) int {
		r := len(walk)
		for _, n := range nodesOf[id] {
			r = min(r, place[n])
		}
		return r
	}
	slices.SortStableFunc(ids, func(a, b string) int { return rank(a) - rank(b) })
	var t Tiers
	for _, id := range ids {
		switch r := rank(id); {
		case r < inMask:
			t.Aligned = append(t.Aligned, id)
		case r < len(walk):
			t.Unaligned = append(t.Unaligned, id)
		default:
			t.NoTopology = append(t.NoTopology, id)
		}
	}
	return t
}

// FilterByAffinity and Census.Tiers, which sort nothing, give the tiers the
// documentation defines, on the cross-check's random resources, for random
// affinities (none, empty, any nodes) and sets of available devices.
func TestTiersMatchTheirDefinition(t *testing.T) {
	aware := 0
	for seed := range uint64(3000) {
		rng := rand.New(rand.NewPCG(seed, 11))
		r := randomRequest(rng)
		affinity := func() *BitMask {
			if rng.IntN(5) == 0 {
				return nil
			}
			var m BitMask
			for n := range 8 {
				if rng.IntN(3) == 0 {
					m |= bit(n)
				}
			}
			return &m
		}
		// FilterByAffinity takes IDs that are not devices too.
		a := affinity()
		require.Equal(t, tiersByDefinition(a, r.Devices, r.Available), FilterByAffinity(a, r.Devices, r.Available), "seed %d", seed)

		c := CountDevices(maps.All(r.Devices), len(r.Devices), func(string) bool { return true })
		ids := sets.List(sets.KeySet(r.Devices))
		if Aware(r.Devices) {
			aware++
		}
		for step := range 4 {
			a := affinity()
			r.Available = someOf(rng, sets.KeySet(r.Devices))
			want := tiersByDefinition(a, r.Devices, r.Available)
			require.Equal(t, want, FilterByAffinity(a, r.Devices, r.Available), "seed %d step %d", seed, step)
			require.Equal(t, want, c.Tiers(a, ids, r.Available.Has), "seed %d step %d: census", seed, step)
		}
	}
	assert.Greater(t, aware, 1000, "topology-aware resources")
}
