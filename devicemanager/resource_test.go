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
	for id, d := range r.devices {
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
	if n != r.healthyN || healthy.Len() != r.healthyLen() || unhealthy.Len() != r.unhealthyLen() {
		wrong = fmt.Sprintf("counted %d healthy (%d count) and %d unhealthy; %d, %d and %d found",
			r.healthyN, r.healthyLen(), r.unhealthyLen(), n, healthy.Len(), unhealthy.Len())
	}
	return healthy, unhealthy, wrong
}

func stateOf(t *testing.T, r *resourceState) deviceState {
	healthy, unhealthy, wrong := healthIDs(r)
	require.Empty(t, wrong)
	st := deviceState{Devices: map[string]string{}, Healthy: sets.List(healthy), Unhealthy: sets.List(unhealthy),
		SortedHealthy: r.sortedHealthy(), SortedIDs: r.sortedDeviceIDs(), Registered: r.registered, Listed: r.listed}
	for id, d := range r.devices {
		require.Equal(t, id, d.ID, "a device under another ID")
		st.Devices[id] = fmt.Sprint(d.Health, d.Topology.GetNodes())
	}
	// The cached sorted lists against the sets they come from.
	require.Equal(t, st.Healthy, st.SortedHealthy, "sorted healthy IDs")
	require.Equal(t, sets.List(sets.KeySet(r.devices)), st.SortedIDs, "sorted IDs")
	return st
}

// An order sorted outside the lock is adopted only by the list it was sorted
// for: after an update in place it still fits; after a list with other IDs
// it is dropped, and the new list is sorted on its own.
func TestAdoptOrderOnlyForItsList(t *testing.T) {
	ids := func(prefix string, unhealthy ...int) []*pluginapi.Device {
		out := []*pluginapi.Device{
			{ID: prefix + "c", Health: pluginapi.Healthy}, {ID: prefix + "a", Health: pluginapi.Healthy},
			{ID: prefix + "b", Health: pluginapi.Healthy},
		}
		for _, i := range unhealthy {
			out[i].Health = pluginapi.Unhealthy
		}
		return out
	}
	r := newResource("r")
	r.setDevices(ids("x"))
	list, byID := r.unsortedList()
	require.NotNil(t, byID, "a new list needs sorting")
	r.setDevices(ids("x", 1)) // in place: same IDs, same order
	order, sorted := sortByID(byID)
	r.adoptOrder(list, order, sorted)
	assert.Equal(t, []int32{1, 2, 0}, r.order, "adopted after an update in place")
	assert.Equal(t, []string{"xb", "xc"}, r.sortedHealthy())
	_, byID = r.unsortedList()
	assert.Nil(t, byID, "nothing left to sort")

	r2 := newResource("r")
	r2.setDevices(ids("x"))
	list, byID = r2.unsortedList()
	r2.setDevices(ids("y", 0)) // other IDs
	order, sorted = sortByID(byID)
	r2.adoptOrder(list, order, sorted)
	assert.Nil(t, r2.order, "an order for an older list is dropped")
	assert.Equal(t, []string{"ya", "yb"}, r2.sortedHealthy())
	assert.Equal(t, []string{"ya", "yb", "yc"}, r2.sortedDeviceIDs())
}

// An update applied in place gives exactly what rebuilding the maps gives:
// the same devices, sets, sorted lists and reported changes, over random
// sequences of lists that mostly repeat the previous order with a few health
// or topology changes, and sometimes reorder, add, drop, duplicate or nil a
// device, with the plugin going away now and then.
func TestUpdateInPlaceMatchesRebuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	inPlace := 0
	for seq := 0; seq < 200; seq++ {
		// lent gets the same lists as fast, as a caller's (copied in).
		fast, slow, lent := newResource("r"), newResource("r"), newResource("r")
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
				lent.markUnhealthy()
			}
			list = next
			if fast.lastList != nil && slices.EqualFunc(sent, fast.lastList, func(a, b *pluginapi.Device) bool {
				return a != nil && a.ID == b.ID
			}) {
				inPlace++
			}
			slow.lastList = nil
			gotChanged, gotHealthy := fast.setDevices(sent)
			wantChanged, wantHealthy := slow.setDevices(sent)
			slices.Sort(gotChanged)
			slices.Sort(wantChanged)
			require.Equal(t, wantChanged, gotChanged, "seq %d step %d: changed", seq, step)
			require.Equal(t, wantHealthy, gotHealthy, "seq %d step %d: healthy set changed", seq, step)
			require.Equal(t, stateOf(t, slow), stateOf(t, fast), "seq %d step %d", seq, step)
			lentChanged, lentHealthy := lent.setBorrowedDevices(sent)
			slices.Sort(lentChanged)
			require.Equal(t, wantChanged, lentChanged, "seq %d step %d: changed (lent)", seq, step)
			require.Equal(t, wantHealthy, lentHealthy, "seq %d step %d: healthy set changed (lent)", seq, step)
			require.Equal(t, stateOf(t, slow), stateOf(t, lent), "seq %d step %d (lent)", seq, step)
			for id, d := range lent.devices {
				require.False(t, slices.Contains(sent, d), "seq %d step %d: %s is the caller's object", seq, step, id)
			}
		}
	}
	t.Logf("%d of 6000 updates applied in place", inPlace)
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

// An update in the same order only touches what changed: unchanged devices
// keep their values, and nothing is re-sorted when the healthy set stays.
func TestUpdateInPlaceKeepsUnchanged(t *testing.T) {
	r := newResource("r")
	first := []*pluginapi.Device{
		{ID: "a", Health: pluginapi.Healthy}, {ID: "b", Health: pluginapi.Healthy}, {ID: "c", Health: pluginapi.Unhealthy},
	}
	changed, healthyChanged := r.setDevices(first)
	assert.ElementsMatch(t, []string{"a", "b", "c"}, changed)
	assert.True(t, healthyChanged)
	sorted := r.sortedHealthy()

	second := []*pluginapi.Device{
		{ID: "a", Health: pluginapi.Healthy}, {ID: "b", Health: pluginapi.Healthy},
		{ID: "c", Health: pluginapi.Unhealthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}},
	}
	changed, healthyChanged = r.setDevices(second)
	assert.Empty(t, changed)
	assert.False(t, healthyChanged)
	assert.Same(t, first[0], r.devices["a"], "an unchanged device keeps its value")
	assert.Same(t, second[2], r.devices["c"], "a device whose topology changed is replaced")
	assert.Equal(t, fmt.Sprint(&sorted[0]), fmt.Sprint(&r.sortedHealthy()[0]), "the healthy IDs were sorted again")

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
// 10,000 GPU-style devices: every device is new, so the maps are built.
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
// (every ID new, so sorted), and after an update flipping 10% of them (the
// IDs keep their order, only the filter runs again). The lists arrive as
// fresh values, as a decoder makes them.
func BenchmarkSnapshotLists(b *testing.B) {
	list := func(unhealthyEvery int) []*pluginapi.Device {
		devs := make([]*pluginapi.Device, 10000)
		for i := range devs {
			devs[i] = &pluginapi.Device{ID: fmt.Sprintf("GPU-%08x-%04x-%04x-%04x-%012x", uint32(i)*2654435761, i, i, i, i),
				Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(i % 2)}}}}
			if unhealthyEvery > 0 && i%unhealthyEvery == 0 {
				devs[i].Health = pluginapi.Unhealthy
			}
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
		msgs := [][]*pluginapi.Device{list(10), list(0), list(10), list(0)}
		r := newResource("r")
		r.setDevices(list(0))
		r.sortedHealthy()
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			msg := msgs[i%len(msgs)]
			i++
			b.StartTimer()
			r.setDevices(msg)
			if got, want := len(r.sortedHealthy()), countHealthy(msg); got != want {
				b.Fatalf("%d healthy, want %d", got, want)
			}
		}
	})
}
