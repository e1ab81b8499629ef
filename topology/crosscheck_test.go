package topology

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// randomQuery draws a resource with multi-node devices, devices on nodes the
// machine lacks or no mask can hold, nil and empty topologies, and a
// question about it with unknown IDs in the device sets and reusable devices
// of every kind.
func randomQuery(rng *rand.Rand) hintQuery {
	machine := rng.Perm(10)[:rng.IntN(7)]
	if rng.IntN(10) == 0 {
		machine = append(machine, 70, -1) // ids no mask can hold
	}
	if len(machine) > 0 && rng.IntN(10) == 0 {
		machine = append(machine, machine[0]) // a repeat
	}
	if rng.IntN(4) > 0 { // keep machines ascending most of the time
		sort.Ints(machine)
	}

	node := func() int64 {
		switch k := rng.IntN(20); {
		case k == 0:
			return 99
		case k == 1:
			return -1
		case k == 2:
			return 64
		case k < 8 || len(machine) == 0:
			return int64(rng.IntN(10))
		default:
			return int64(machine[rng.IntN(len(machine))])
		}
	}
	devices := make(map[string]*pluginapi.Device)
	var ids []string
	for i := range rng.IntN(25) {
		id := fmt.Sprintf("d%02d", i)
		ids = append(ids, id)
		switch k := rng.IntN(20); {
		case k == 0:
			devices[id] = nil
		case k < 3:
			devices[id] = plainDev(id)
		case k < 5:
			devices[id] = numaDev(id)
		default:
			d := numaDev(id)
			for range 1 + rng.IntN(3) {
				d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: node()})
			}
			if rng.IntN(30) == 0 {
				d.Topology.Nodes = append(d.Topology.Nodes, nil)
			}
			devices[id] = d
		}
	}
	ids = append(ids, "ghost1", "ghost2")

	q := hintQuery{machine: machine, devices: devices, healthy: sets.New[string](), allocated: sets.New[string](), request: rng.IntN(7)}
	if rng.IntN(3) > 0 {
		q.reusable = sets.New[string]()
	}
	for _, id := range ids {
		if rng.IntN(5) > 0 {
			q.healthy.Insert(id)
		}
		switch k := rng.IntN(20); {
		case k < 11: // free, if healthy
		case k < 14 && q.reusable != nil: // the reuse pool, allocated
			q.allocated.Insert(id)
			q.reusable.Insert(id)
		case k == 14 && q.reusable != nil: // reusable yet free: not produced by the kubelet
			q.reusable.Insert(id)
		default:
			q.allocated.Insert(id)
		}
	}
	if rng.IntN(6) == 0 {
		q.held = sets.New[string]()
		for _, id := range ids {
			if rng.IntN(3) == 0 {
				q.held.Insert(id)
			}
		}
		if rng.IntN(2) == 0 {
			q.request = q.held.Len()
		}
	}
	return q
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

// A census answers as the reference on seeded random resources, and goes on
// doing so for other sets of allocated devices (healthy ones, unhealthy ones
// and IDs it does not know): asking does not change it.
func TestCensusHintsMatchReference(t *testing.T) {
	const rounds = 3000
	withHints, withPreferred, withNotPreferred := 0, 0, 0
	for seed := range uint64(rounds) {
		rng := rand.New(rand.NewPCG(seed, 42))
		q := randomQuery(rng)
		c := q.census()
		for step := range 4 {
			if step > 0 {
				q.allocated = someOf(rng, sets.KeySet(q.devices).Insert("ghost-never-listed"))
			}
			want := referenceHints(q)
			got := c.Hints(q.machine, q.allocated, q.reusable, q.held, q.request)
			require.Equal(t, want == nil, got == nil, "seed %d step %d nil-ness: %s", seed, step, describe(q))
			require.Equal(t, want, got, "seed %d step %d: %s", seed, step, describe(q))
			if len(got) > 0 {
				withHints++
			}
			for _, h := range got {
				if h.Preferred {
					withPreferred++
				} else {
					withNotPreferred++
				}
			}
		}
	}
	// The draw must exercise real outcomes, not compare empty lists.
	assert.Greater(t, withHints, rounds, "answers with hints")
	assert.Positive(t, withPreferred)
	assert.Positive(t, withNotPreferred)
}

// Census.Tiers, which sorts nothing, gives the tiers the reference defines,
// on the random resources, for random affinities (none, empty, any nodes)
// and sets of available devices, IDs the census does not know included.
func TestCensusTiersMatchReference(t *testing.T) {
	aware := 0
	for seed := range uint64(3000) {
		rng := rand.New(rand.NewPCG(seed, 11))
		q := randomQuery(rng)
		c := q.census() // health plays no part in tiers
		ids := sets.KeySet(q.devices).Insert("ghost1", "ghost2")
		if c.aware {
			aware++
		}
		for step := range 4 {
			var affinity *BitMask
			if rng.IntN(5) > 0 {
				var m BitMask
				for n := range 8 {
					if rng.IntN(3) == 0 {
						m |= bit(n)
					}
				}
				affinity = &m
			}
			available := someOf(rng, ids)
			want := referenceTiers(affinity, q.devices, available)
			require.Equal(t, want, c.Tiers(affinity, sets.List(ids), available.Has), "seed %d step %d", seed, step)
		}
	}
	assert.Greater(t, aware, 1000, "topology-aware resources")
}

func describe(q hintQuery) string {
	var devs []string
	for id, d := range q.devices {
		switch {
		case d == nil:
			devs = append(devs, id+"=nil")
		case d.Topology == nil:
			devs = append(devs, id+"=-")
		default:
			devs = append(devs, fmt.Sprintf("%s=%v", id, nodeIDs(d)))
		}
	}
	sort.Strings(devs)
	return fmt.Sprintf("machine=%v devices=%v healthy=%v allocated=%v reusable=%v held=%v request=%d",
		q.machine, devs, sets.List(q.healthy), sets.List(q.allocated), sets.List(q.reusable), sets.List(q.held), q.request)
}
