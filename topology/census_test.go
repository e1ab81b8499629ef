package topology

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"
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
