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

// naiveIDs is getNUMANodeIds: nil for no topology, else every listed id
// (nil entries skipped), whatever its range.
func naiveIDs(d *pluginapi.Device) []int {
	if d == nil || d.Topology == nil {
		return nil
	}
	ids := []int{}
	for _, n := range d.Topology.Nodes {
		if n != nil {
			ids = append(ids, int(n.ID))
		}
	}
	return ids
}

// naiveSubsets lists the non-empty subsets of nodes by size, each size in
// lexicographic combination order, by plain recursion.
func naiveSubsets(nodes []int) []BitMask {
	var out []BitMask
	var pick func(start, size int, chosen []int)
	pick = func(start, size int, chosen []int) {
		if len(chosen) == size {
			var m BitMask
			for _, n := range chosen {
				m |= BitMask(1) << n
			}
			out = append(out, m)
			return
		}
		for i := start; i < len(nodes); i++ {
			pick(i+1, size, append(chosen, nodes[i]))
		}
	}
	for size := 1; size <= len(nodes); size++ {
		pick(0, size, nil)
	}
	return out
}

// naiveGenerate is the kubelet's generateDeviceTopologyHints written out
// plainly: every device examined for every mask. devmgr's readings are kept:
// missing devices have no topology, a device both reusable and available
// counts once (as reusable), ids outside 0..63 are never in a mask.
func naiveGenerate(machine []int, devices map[string]*pluginapi.Device,
	available, reusable sets.Set[string], request int) []Hint {
	var usable []int
	onMachine := map[int]bool{}
	for _, n := range machine {
		if n >= 0 && n <= 63 && !onMachine[n] {
			onMachine[n] = true
			usable = append(usable, n)
		}
	}
	carrying := map[int]bool{}
	for _, d := range devices {
		for _, id := range naiveIDs(d) {
			if onMachine[id] {
				carrying[id] = true
			}
		}
	}
	var candidates []int
	for id := range carrying {
		candidates = append(candidates, id)
	}
	sort.Ints(candidates)
	if len(candidates) == 0 {
		candidates = usable
	}

	minSize := len(candidates)
	hints := []Hint{}
	for _, m := range naiveSubsets(candidates) {
		inMask := 0
		for _, d := range devices {
			if m.AnySet(naiveIDs(d)) {
				inMask++
			}
		}
		if inMask >= request && m.Count() < minSize {
			minSize = m.Count()
		}
		matching, rejected := 0, false
		for id := range reusable {
			d := devices[id]
			if d == nil || d.Topology == nil {
				continue
			}
			if !m.AnySet(naiveIDs(d)) {
				rejected = true
				break
			}
			matching++
		}
		if rejected {
			continue
		}
		for id := range available {
			if reusable.Has(id) {
				continue
			}
			if m.AnySet(naiveIDs(devices[id])) {
				matching++
			}
		}
		if matching >= request {
			mm := m
			hints = append(hints, Hint{NUMANodeAffinity: &mm})
		}
	}
	for i := range hints {
		hints[i].Preferred = hints[i].NUMANodeAffinity.Count() == minSize
	}
	return hints
}

// naiveResourceHints is the kubelet's per-resource decision of
// GetTopologyHints written out plainly over naiveGenerate.
func naiveResourceHints(r HintRequest) []Hint {
	aware, machineOK := false, false
	for _, d := range r.Devices {
		if len(naiveIDs(d)) > 0 {
			aware = true
		}
	}
	for _, n := range r.MachineNodes {
		if n >= 0 && n <= 63 {
			machineOK = true
		}
	}
	if !aware || !machineOK {
		return nil
	}
	if r.Held.Len() > 0 {
		if r.Held.Len() != r.Request {
			return []Hint{}
		}
		return naiveGenerate(r.MachineNodes, r.Devices, r.Held, nil, r.Request)
	}
	if r.Available.Union(r.Reusable).Len() < r.Request {
		return []Hint{}
	}
	return naiveGenerate(r.MachineNodes, r.Devices, r.Available, r.Reusable, r.Request)
}

// randomRequest draws a resource with multi-node devices, devices on nodes
// the machine lacks or no mask can hold, nil and empty topologies, unknown
// IDs in the device sets and reusable devices of every kind.
func randomRequest(rng *rand.Rand) HintRequest {
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

	r := HintRequest{MachineNodes: machine, Devices: devices, Available: sets.New[string](), Request: rng.IntN(7)}
	if rng.IntN(3) > 0 {
		r.Reusable = sets.New[string]()
	}
	for _, id := range ids {
		switch k := rng.IntN(20); {
		case k < 11:
			r.Available.Insert(id)
		case k < 14 && r.Reusable != nil:
			r.Reusable.Insert(id)
		case k == 14 && r.Reusable != nil: // both: not produced by the kubelet
			r.Available.Insert(id)
			r.Reusable.Insert(id)
		}
	}
	if rng.IntN(6) == 0 {
		r.Held = sets.New[string]()
		for _, id := range ids {
			if rng.IntN(3) == 0 {
				r.Held.Insert(id)
			}
		}
		if rng.IntN(2) == 0 {
			r.Request = r.Held.Len()
		}
	}
	return r
}

// TestGenerateHintsMatchesNaive cross-checks the signature-count generator
// against naiveGenerate on seeded random resources.
func TestGenerateHintsMatchesNaive(t *testing.T) {
	const rounds = 3000
	withHints, withPreferred, withNotPreferred := 0, 0, 0
	for seed := range uint64(rounds) {
		rng := rand.New(rand.NewPCG(seed, 42))
		r := randomRequest(rng)
		want := naiveGenerate(r.MachineNodes, r.Devices, r.Available, r.Reusable, r.Request)
		got := GenerateHints(r.MachineNodes, r.Devices, r.Available, r.Reusable, r.Request)
		require.Equal(t, want, got, "seed %d: %s", seed, describe(r))

		wantR := naiveResourceHints(r)
		gotR := ResourceHints(r)
		require.Equal(t, wantR == nil, gotR == nil, "seed %d: nil-ness: %s", seed, describe(r))
		require.Equal(t, wantR, gotR, "seed %d: %s", seed, describe(r))

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
	// The draw must exercise real outcomes, not compare empty lists.
	assert.Greater(t, withHints, rounds/4, "rounds with hints")
	assert.Positive(t, withPreferred)
	assert.Positive(t, withNotPreferred)
}

func describe(r HintRequest) string {
	var devs []string
	for id, d := range r.Devices {
		switch {
		case d == nil:
			devs = append(devs, id+"=nil")
		case d.Topology == nil:
			devs = append(devs, id+"=-")
		default:
			devs = append(devs, fmt.Sprintf("%s=%v", id, naiveIDs(d)))
		}
	}
	sort.Strings(devs)
	return fmt.Sprintf("machine=%v devices=%v available=%v reusable=%v held=%v request=%d",
		r.MachineNodes, devs, sets.List(r.Available), sets.List(r.Reusable), sets.List(r.Held), r.Request)
}
