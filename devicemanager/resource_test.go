package devicemanager

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/topology"
)

// deviceState is what a resource's device lists amount to, for comparing two
// ways of applying them.
type deviceState struct {
	Devices            map[string]string // ID -> health and NUMA nodes
	Healthy, Unhealthy []string
	SortedHealthy      []string
	SortedIDs          []string
	Registered, Listed bool
}

// healthIDs returns the IDs of r's devices that count as healthy and as
// unhealthy, and what is wrong with r's counts of them ("" if nothing).
func healthIDs(r *resourceState) (healthy, unhealthy sets.Set[string], wrong string) {
	healthy, unhealthy = sets.New[string](), sets.New[string]()
	n := 0
	for id, d := range r.deviceMap() {
		if d.Health == pluginapi.Healthy {
			n++
		}
		switch {
		case r.isHealthy(id):
			healthy.Insert(id)
		case r.registered:
			unhealthy.Insert(id)
		}
	}
	if n != r.healthy || healthy.Len() != r.healthyLen() || unhealthy.Len() != r.capacityLen()-r.healthyLen() {
		wrong = fmt.Sprintf("counted %d healthy (%d count) of %d; %d, %d and %d unhealthy found",
			r.healthy, r.healthyLen(), r.capacityLen(), n, healthy.Len(), unhealthy.Len())
	}
	return healthy, unhealthy, wrong
}

func sortedIDs(r *resourceState) []string {
	out := []string{}
	for _, d := range r.sortedDevices() {
		out = append(out, d.id)
	}
	return out
}

func stateOf(t *testing.T, r *resourceState) deviceState {
	healthy, unhealthy, wrong := healthIDs(r)
	require.Empty(t, wrong)
	st := deviceState{Devices: map[string]string{}, Healthy: sets.List(healthy), Unhealthy: sets.List(unhealthy),
		SortedHealthy: r.sortedHealthy(), SortedIDs: sortedIDs(r), Registered: r.registered, Listed: r.listed}
	for id, d := range r.deviceMap() {
		require.Equal(t, id, d.ID, "a device under another ID")
		st.Devices[id] = fmt.Sprint(d.Health, d.Topology.GetNodes())
	}
	require.Equal(t, st.Healthy, st.SortedHealthy, "sorted healthy IDs")
	require.Equal(t, sets.List(sets.KeySet(r.deviceMap())), st.SortedIDs, "sorted IDs")
	return st
}

// A list of the same IDs, applied in place, gives exactly what replacing
// the whole list gives: the same devices, counts, sorted lists and reported
// changes, over random sequences of lists that mostly repeat the previous
// IDs (in any order) with a few health or topology changes, and sometimes
// add, drop, repeat or nil a device, with the plugin going away now and
// then.
func TestUpdateInPlaceMatchesReplace(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	inPlace := 0
	for seq := 0; seq < 200; seq++ {
		fast, slow := newResource("r"), newResource("r")
		var list []*pluginapi.Device
		for i := range 1 + rng.IntN(12) {
			list = append(list, randomDevice(rng, fmt.Sprintf("dev-%02d", i)))
		}
		for step := 0; step < 30; step++ {
			next := make([]*pluginapi.Device, 0, len(list)+1)
			for _, d := range list {
				c := &pluginapi.Device{ID: d.ID, Health: d.Health, Topology: d.Topology}
				if rng.IntN(4) == 0 {
					c = randomDevice(rng, d.ID)
				}
				next = append(next, c)
			}
			// A nil or a duplicate is sent once; the next list is built from
			// the clean one.
			sent := next
			switch rng.IntN(12) {
			case 0:
				rng.Shuffle(len(next), func(i, j int) { next[i], next[j] = next[j], next[i] })
			case 1:
				next = append(next, randomDevice(rng, fmt.Sprintf("dev-%02d", 12+rng.IntN(4))))
				sent = next
			case 2:
				if len(next) > 0 {
					next = next[:len(next)-1]
					sent = next
				}
			case 3:
				if len(next) > 0 {
					sent = append(slices.Clone(next), randomDevice(rng, next[rng.IntN(len(next))].GetID()))
				}
			case 4:
				sent = append(slices.Clone(next), nil)
			case 5:
				fast.markUnhealthy()
				slow.markUnhealthy()
			}
			list = next
			if fast.known(sent) != nil {
				inPlace++
			}
			slow.listed = false // never in place
			gotChanged, gotHealthy := fast.setDevices(sent)
			wantChanged, wantHealthy := slow.setDevices(sent)
			slices.Sort(gotChanged)
			slices.Sort(wantChanged)
			require.Equal(t, wantChanged, gotChanged, "seq %d step %d: changed", seq, step)
			require.Equal(t, wantHealthy, gotHealthy, "seq %d step %d: healthy set changed", seq, step)
			require.Equal(t, stateOf(t, slow), stateOf(t, fast), "seq %d step %d", seq, step)
		}
	}
	assert.Greater(t, inPlace, 2000, "the in-place path was hardly taken")
}

func randomDevice(rng *rand.Rand, id string) *pluginapi.Device {
	d := &pluginapi.Device{ID: id, Health: []string{pluginapi.Healthy, pluginapi.Unhealthy, "Unknown"}[rng.IntN(3)]}
	switch rng.IntN(3) {
	case 1:
		d.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(rng.IntN(2))}}}
	case 2:
		d.Topology = &pluginapi.TopologyInfo{}
	}
	return d
}

// An update of the same IDs only touches what changed: unchanged devices
// keep their values, a device whose topology alone changed is replaced
// without counting as changed, and a health change is reported.
func TestUpdateInPlaceKeepsUnchanged(t *testing.T) {
	r := newResource("r")
	first := []*pluginapi.Device{
		{ID: "a", Health: pluginapi.Healthy}, {ID: "b", Health: pluginapi.Healthy}, {ID: "c", Health: pluginapi.Unhealthy},
	}
	changed, healthyChanged := r.setDevices(first)
	assert.ElementsMatch(t, []string{"a", "b", "c"}, changed)
	assert.True(t, healthyChanged)

	second := []*pluginapi.Device{
		{ID: "c", Health: pluginapi.Unhealthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}},
		{ID: "a", Health: pluginapi.Healthy}, {ID: "b", Health: pluginapi.Healthy},
	}
	changed, healthyChanged = r.setDevices(second)
	assert.Empty(t, changed)
	assert.False(t, healthyChanged)
	assert.Same(t, first[0], r.device("a"), "an unchanged device keeps its value")
	assert.Same(t, second[0], r.device("c"), "a device whose topology changed is replaced")

	third := []*pluginapi.Device{
		{ID: "a", Health: pluginapi.Healthy}, {ID: "b", Health: pluginapi.Unhealthy}, {ID: "c", Health: pluginapi.Unhealthy},
	}
	changed, healthyChanged = r.setDevices(third)
	assert.Equal(t, []string{"b"}, changed)
	assert.True(t, healthyChanged)
	assert.Equal(t, []string{"a"}, r.sortedHealthy())
	_, unhealthy, _ := healthIDs(r)
	assert.Equal(t, []string{"b", "c"}, sets.List(unhealthy))
}

// BenchmarkSetDevicesFirstList applies the first list of a plugin with
// 10,000 GPU-style devices: every device is new.
func BenchmarkSetDevicesFirstList(b *testing.B) {
	devs := make([]*pluginapi.Device, 10000)
	for i := range devs {
		devs[i] = &pluginapi.Device{ID: fmt.Sprintf("GPU-%08x-%04x-%04x-%04x-%012x", i*7919, i, i, i, i),
			Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(i % 2)}}}}
	}
	b.ReportAllocs()
	for b.Loop() {
		if changed, _ := newResource("r").setDevices(devs); len(changed) != len(devs) {
			b.Fatalf("%d devices changed, want %d", len(changed), len(devs))
		}
	}
}

// BenchmarkSnapshotLists times what the checkpoint needs of a resource of
// 10,000 GPU-style devices, its healthy IDs in order: after the first list
// (every ID new, so sorted), and after an update making a random tenth of
// them unhealthy (the IDs are the same: only the filter runs again). The
// lists arrive as fresh values, as a decoder makes them.
func BenchmarkSnapshotLists(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	list := func(unhealthy int) []*pluginapi.Device {
		devs := make([]*pluginapi.Device, 10000)
		for i := range devs {
			devs[i] = &pluginapi.Device{ID: fmt.Sprintf("GPU-%08x-%04x-%04x-%04x-%012x", uint32(i)*2654435761, i, i, i, i),
				Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(i % 2)}}}}
		}
		for _, i := range rng.Perm(len(devs))[:unhealthy] {
			devs[i].Health = pluginapi.Unhealthy
		}
		return devs
	}
	b.Run("first", func(b *testing.B) {
		devs := list(0)
		b.ReportAllocs()
		for b.Loop() {
			r := newResource("r")
			r.setDevices(devs)
			if got := len(r.sortedHealthy()); got != len(devs) {
				b.Fatalf("%d healthy, want %d", got, len(devs))
			}
		}
	})
	b.Run("update", func(b *testing.B) {
		msgs := [][]*pluginapi.Device{list(1000), list(900), list(1000), list(900)}
		r := newResource("r")
		r.setDevices(list(0))
		r.sortedHealthy()
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			msg := msgs[i%len(msgs)]
			i++
			r.setDevices(msg)
			if got, want := len(r.sortedHealthy()), countHealthy(msg); got != want {
				b.Fatalf("%d healthy, want %d", got, want)
			}
		}
	})
}

// refModel is what one resource's device health amounts to, kept the plain
// way: the last list's health per ID, whether the resource is registered,
// and whether its plugin is gone.
type refModel struct {
	registered, down bool
	devices          map[string]string
}

func (m *refModel) healthy() sets.Set[string] {
	s := sets.New[string]()
	if !m.registered || m.down {
		return s
	}
	for id, h := range m.devices {
		if h == pluginapi.Healthy {
			s.Insert(id)
		}
	}
	return s
}

// Over random sequences of lists (in place or not, with repeated IDs and health strings the API does not define), plugins gone,
// resources retired and restored from the checkpoint, the resource counts,
// lists and reports healthy and free devices as the plain model does, and
// reports every change of its healthy set.
func TestResourceMatchesModel(t *testing.T) {
	healths := []string{pluginapi.Healthy, pluginapi.Unhealthy, "Bogus"}
	for seed := uint64(0); seed < 3000; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		c := newCore(limits{})
		r := newResource("res")
		c.resources["res"] = r
		ref := &refModel{devices: map[string]string{}}
		if rng.IntN(4) == 0 { // restored from checkpoint
			r.registered = true
			ref.registered = true
		}
		var last []*pluginapi.Device
		var log []string
		for step := 0; step < 30; step++ {
			var op string
			switch k := rng.IntN(10); {
			case k < 6:
				var devs []*pluginapi.Device
				if last != nil && rng.IntN(2) == 0 { // the same IDs: in place
					for _, d := range last {
						if rng.IntN(3) == 0 {
							d = &pluginapi.Device{ID: d.ID, Health: healths[rng.IntN(3)], Topology: d.Topology}
						}
						devs = append(devs, d)
					}
					rng.Shuffle(len(devs), func(i, j int) { devs[i], devs[j] = devs[j], devs[i] })
				} else {
					for range rng.IntN(6) {
						d := &pluginapi.Device{ID: fmt.Sprintf("d%d", rng.IntN(8)), Health: healths[rng.IntN(3)]}
						if n := rng.IntN(3); n < 2 {
							d.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(n)}}}
						}
						devs = append(devs, d)
					}
				}
				oldHealthy := ref.healthy()
				wasReg := ref.registered
				ref.devices = map[string]string{}
				for _, d := range devs {
					ref.devices[d.ID] = d.Health
				}
				ref.registered, ref.down = true, false
				_, hc := r.setDevices(devs)
				op = fmt.Sprintf("list%v", devIDs(devs))
				// A first list always counts as a change; any other must
				// say so exactly when the healthy set changed.
				if wasReg && !oldHealthy.Equal(ref.healthy()) != hc {
					t.Fatalf("seed %d %v %s: healthy set %v->%v, healthyChanged %v", seed, log, op, sets.List(oldHealthy), sets.List(ref.healthy()), hc)
				}
				last = devs
			case k < 8:
				op = "gone"
				r.markUnhealthy()
				ref.down = true
				last = nil
			case k < 9:
				if r.registered {
					op = "retire"
					c.removeResources([]string{"res"})
					ref.registered = false
					last = nil
				}
			default:
				op = "read"
				r.sortedHealthy()
				c.census(r)
			}
			log = append(log, op)
			want := ref.healthy()
			wantCap := 0
			if ref.registered {
				wantCap = len(ref.devices)
			}
			if r.healthyLen() != want.Len() || r.capacityLen() != wantCap {
				t.Fatalf("seed %d %v: healthy %d capacity %d, want healthy %d capacity %d", seed, log, r.healthyLen(), r.capacityLen(), want.Len(), wantCap)
			}
			if got := r.sortedHealthy(); !slices.Equal(got, sets.List(want)) {
				t.Fatalf("seed %d %v: sortedHealthy %v want %v", seed, log, got, sets.List(want))
			}
			free := c.free(r)
			for id := range ref.devices {
				if r.isHealthy(id) != want.Has(id) || free.Has(id) != want.Has(id) {
					t.Fatalf("seed %d %v: isHealthy(%s) %v, free %v", seed, log, id, r.isHealthy(id), free.Has(id))
				}
			}
			if free.Len() != want.Len() {
				t.Fatalf("seed %d %v: %d free, want %d", seed, log, free.Len(), want.Len())
			}
			// A census built before (by "read") must have been dropped by
			// any change since that it would count differently.
			if r.census != nil {
				fresh := topology.CountDevices(r.byID, len(r.devices), r.isHealthy)
				for request := 1; request <= 3; request++ {
					got, want := r.census.Hints([]int{0, 1}, nil, nil, nil, request), fresh.Hints([]int{0, 1}, nil, nil, nil, request)
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Fatalf("seed %d %v: stale census %v, fresh %v", seed, log, got, want)
					}
				}
			}
			if got, want := sortedIDs(r), sets.List(sets.KeySet(ref.devices)); !slices.Equal(got, want) {
				t.Fatalf("seed %d %v: sorted IDs %v want %v", seed, log, got, want)
			}
		}
	}
}

// devIDs describes a list for failure messages: ID and health's initial.
func devIDs(devs []*pluginapi.Device) []string {
	var s []string
	for _, d := range devs {
		s = append(s, d.ID+":"+d.Health[:1])
	}
	return s
}

// A nil NUMA node entry and node 0 are different topologies: the device is
// updated.
func TestNilNodeToNodeZeroUpdatesTopology(t *testing.T) {
	r := newResource(res1)
	withNil := &pluginapi.Device{ID: "d", Health: healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{nil}}}
	r.setDevices([]*pluginapi.Device{withNil})
	r.setDevices([]*pluginapi.Device{dev("d", healthy, 0)})
	require.NotNil(t, r.device("d").Topology.Nodes[0])
}
