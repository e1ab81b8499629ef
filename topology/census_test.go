package topology

import (
	"cmp"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// A Census answers what ResourceHints answers, on the cross-check's random
// resources, before and after devices change availability.
func TestCensusMatchesResourceHints(t *testing.T) {
	const rounds = 3000
	withHints := 0
	for seed := range uint64(rounds) {
		rng := rand.New(rand.NewPCG(seed, 7))
		r := randomRequest(rng)
		// Available devices are devices of the resource (healthy ones).
		for id := range r.Available {
			if _, ok := r.Devices[id]; !ok {
				r.Available.Delete(id)
			}
		}
		c := NewCensus(r.Devices, r.Available.Has)
		for step := range 4 {
			want := ResourceHints(r)
			got := c.Hints(r.MachineNodes, r.Reusable, r.Held, r.Request)
			require.Equal(t, want == nil, got == nil, "seed %d step %d nil-ness: %s", seed, step, describe(r))
			require.Equal(t, want, got, "seed %d step %d: %s", seed, step, describe(r))
			assert.Equal(t, r.Available.Len(), c.Available())
			if len(got) > 0 {
				withHints++
			}
			// Some devices are allocated or released.
			for id := range r.Devices {
				if rng.IntN(4) == 0 {
					avail := !r.Available.Has(id)
					c.SetAvailable(id, avail)
					if avail {
						r.Available.Insert(id)
					} else {
						r.Available.Delete(id)
					}
				}
			}
			c.SetAvailable("ghost-never-listed", true) // ignored
		}
	}
	assert.Greater(t, withHints, rounds, "rounds with hints")
}

func BenchmarkCensusHints(b *testing.B) {
	devices := deviceMap()
	for i := range 10000 {
		id := string(rune('a'+i%26)) + string(rune('0'+i%10)) + string(rune(i))
		devices[id] = numaDev(id, int64(i%2))
	}
	available := sets.KeySet(devices)
	c := NewCensus(devices, available.Has)
	b.ReportAllocs()
	for b.Loop() {
		c.Hints([]int{0, 1}, nil, nil, 4)
	}
}

// filterByAffinityBefore is FilterByAffinity as it was before it walked the
// devices in ID order (it sorted them): the reference for the one-pass
// versions.
func filterByAffinityBefore(affinity *BitMask, devices map[string]*pluginapi.Device, available sets.Set[string]) Tiers {
	if affinity == nil || !Aware(devices) {
		return Tiers{NoTopology: nilIfEmpty(sets.List(available))}
	}

	type entry struct {
		id   string
		sig  BitMask
		rank int // position of the device's first node in the walk
	}
	entries := make([]entry, 0, len(available))
	var perNode [maxNode + 1]int
	for id := range available {
		sig, _ := signature(devices[id])
		entries = append(entries, entry{id: id, sig: sig})
		for rest := uint64(sig); rest != 0; rest &= rest - 1 {
			perNode[bits.TrailingZeros64(rest)]++
		}
	}

	mask := *affinity
	walk := make([]int, 0, maxNode+1)
	for n, c := range perNode {
		if c > 0 {
			walk = append(walk, n)
		}
	}
	slices.SortFunc(walk, func(a, b int) int {
		if ia, ib := mask.IsSet(a), mask.IsSet(b); ia != ib {
			if ia {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(perNode[a], perNode[b]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	var rankOf [maxNode + 1]int
	inMask := 0
	for i, n := range walk {
		rankOf[n] = i
		if mask.IsSet(n) {
			inMask++
		}
	}

	noTopology := len(walk)
	for i := range entries {
		e := &entries[i]
		e.rank = noTopology
		for rest := uint64(e.sig); rest != 0; rest &= rest - 1 {
			e.rank = min(e.rank, rankOf[bits.TrailingZeros64(rest)])
		}
	}
	slices.SortFunc(entries, func(a, b entry) int {
		if c := cmp.Compare(a.rank, b.rank); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})

	ids := make([]string, len(entries))
	aligned, unaligned := 0, 0
	for i, e := range entries {
		ids[i] = e.id
		switch {
		case e.rank < inMask:
			aligned++
		case e.rank < noTopology:
			unaligned++
		}
	}
	return Tiers{
		Aligned:    nilIfEmpty(ids[:aligned:aligned]),
		Unaligned:  nilIfEmpty(ids[aligned : aligned+unaligned : aligned+unaligned]),
		NoTopology: nilIfEmpty(ids[aligned+unaligned:]),
	}
}

// FilterByAffinity and Census.Tiers, which sort nothing, give the tiers the
// sorting version gave, on the cross-check's random resources, for random
// affinities (none, empty, any nodes), as devices change availability.
func TestTiersMatchTheSortingFilter(t *testing.T) {
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
		require.Equal(t, filterByAffinityBefore(a, r.Devices, r.Available), FilterByAffinity(a, r.Devices, r.Available), "seed %d", seed)

		for id := range r.Available {
			if _, ok := r.Devices[id]; !ok {
				r.Available.Delete(id)
			}
		}
		c := NewCensus(r.Devices, r.Available.Has)
		ids := sets.List(sets.KeySet(r.Devices))
		if Aware(r.Devices) {
			aware++
		}
		for step := range 4 {
			a := affinity()
			want := filterByAffinityBefore(a, r.Devices, r.Available)
			require.Equal(t, want, FilterByAffinity(a, r.Devices, r.Available), "seed %d step %d", seed, step)
			require.Equal(t, want, c.Tiers(a, ids), "seed %d step %d: census", seed, step)
			for id := range r.Devices {
				if rng.IntN(4) == 0 {
					avail := !r.Available.Has(id)
					c.SetAvailable(id, avail)
					if avail {
						r.Available.Insert(id)
					} else {
						r.Available.Delete(id)
					}
				}
			}
		}
	}
	assert.Greater(t, aware, 1000, "topology-aware resources")
}
