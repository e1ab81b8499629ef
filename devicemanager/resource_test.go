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

	"github.com/openkubelet/devmgr/podstate"
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
	for id, d := range r.deviceMap() {
		require.Equal(t, id, d.ID, "a device under another ID")
		st.Devices[id] = fmt.Sprint(d.Health, d.Topology.GetNodes())
	}
	// The cached sorted lists against the sets they come from.
	require.Equal(t, st.Healthy, st.SortedHealthy, "sorted healthy IDs")
	require.Equal(t, sets.List(sets.KeySet(r.deviceMap())), st.SortedIDs, "sorted IDs")
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
			if fast.inOrder && slices.EqualFunc(sent, fast.devices, func(a, b *pluginapi.Device) bool {
				return a != nil && a.ID == b.ID
			}) {
				inPlace++
			}
			slow.inOrder = false
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
			for id, d := range lent.deviceMap() {
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
	assert.Same(t, first[0], r.device("a"), "an unchanged device keeps its value")
	assert.Same(t, second[2], r.device("c"), "a device whose topology changed is replaced")
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

// Over random sequences of lists (in place or not, lent or not, with
// repeated IDs and health strings the API does not define), plugins gone,
// resources retired and restored from the checkpoint, the resource counts,
// lists and reports healthy and free devices as the plain model does, and
// reports every change of its healthy set.
func TestResourceMatchesModel(t *testing.T) {
	healths := []string{pluginapi.Healthy, pluginapi.Unhealthy, "Bogus"}
	for seed := uint64(0); seed < 3000; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		check := rand.New(rand.NewPCG(seed, 2))
		m := &ManagerImpl{resources: map[string]*resourceState{}, ledger: podstate.NewLedger()}
		r := newResource("res")
		m.resources["res"] = r
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
				if last != nil && rng.IntN(2) == 0 { // same IDs same order: in place
					for _, d := range last {
						if rng.IntN(3) == 0 {
							d = &pluginapi.Device{ID: d.ID, Health: healths[rng.IntN(3)]}
						}
						devs = append(devs, d)
					}
				} else {
					for range rng.IntN(6) {
						devs = append(devs, &pluginapi.Device{ID: fmt.Sprintf("d%d", rng.IntN(8)), Health: healths[rng.IntN(3)]})
					}
				}
				oldHealthy := ref.healthy()
				wasReg := ref.registered
				ref.devices = map[string]string{}
				for _, d := range devs {
					ref.devices[d.ID] = d.Health
				}
				ref.registered, ref.down = true, false
				borrowed := rng.IntN(2) == 0
				var hc bool
				if borrowed {
					_, hc = r.setBorrowedDevices(devs)
				} else {
					_, hc = r.setDevices(devs)
				}
				op = fmt.Sprintf("list%v(b=%v)", devIDs(devs), borrowed)
				// A first list always counts as a change; any other must
				// say so when the healthy set changed.
				if wasReg && !oldHealthy.Equal(ref.healthy()) && !hc {
					t.Fatalf("seed %d %v %s: healthy set changed %v->%v, healthyChanged false", seed, log, op, sets.List(oldHealthy), sets.List(ref.healthy()))
				}
				last = devs
				if list, byID := r.unsortedList(); byID != nil && rng.IntN(2) == 0 {
					order, ids := sortByID(byID)
					r.adoptOrder(list, order, ids)
				}
			case k < 8:
				op = "gone"
				r.markUnhealthy()
				ref.down = true
				last = nil
			case k < 9:
				if r.registered {
					op = "retire"
					m.collectResourcesLocked([]string{"res"})
					ref.registered = false
					last = nil
				}
			default:
				op = "read"
				r.sortedHealthy()
				m.censusLocked(r)
			}
			log = append(log, op)
			want := ref.healthy()
			wantCap := 0
			if ref.registered {
				wantCap = len(ref.devices)
			}
			if r.healthyLen() != want.Len() || r.capacityLen() != wantCap || r.healthyLen()+r.unhealthyLen() != wantCap {
				t.Fatalf("seed %d %v: healthy %d unhealthy %d, want healthy %d capacity %d", seed, log, r.healthyLen(), r.unhealthyLen(), want.Len(), wantCap)
			}
			if got := r.sortedHealthy(); !slices.Equal(got, sets.List(want)) {
				t.Fatalf("seed %d %v: sortedHealthy %v want %v", seed, log, got, sets.List(want))
			}
			// A census built before (by "read") must have followed every
			// change since, or have been dropped.
			if r.census != nil {
				view := freeDevices{r.census}
				for id := range ref.devices {
					if view.Has(id) != want.Has(id) {
						t.Fatalf("seed %d %v: census counts %s free: %v", seed, log, id, view.Has(id))
					}
				}
				if view.Len() != want.Len() {
					t.Fatalf("seed %d %v: census counts %d free, want %d", seed, log, view.Len(), want.Len())
				}
			}
			for id := range ref.devices {
				if r.isHealthy(id) != want.Has(id) {
					t.Fatalf("seed %d %v: isHealthy(%s)", seed, log, id)
				}
			}
			// The IDs in order (Status lists them so) on a third of the
			// steps, from a generator of their own: reading them sorts and
			// caches, which the other steps must also do without.
			if check.IntN(3) == 0 {
				if got, want := r.sortedDeviceIDs(), sets.List(sets.KeySet(ref.devices)); !slices.Equal(got, want) {
					t.Fatalf("seed %d %v: sortedDeviceIDs %v want %v", seed, log, got, want)
				}
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

// A device flapping in a lent list takes back, on its flip back, the value
// it had before: no copy per flip, and the healthy IDs are the very slice
// sorted for that health before. A device whose topology changed in the
// meantime is not given its old value back.
func TestLentFlapReusesEarlierValues(t *testing.T) {
	r := newResource("r")
	list := func(bHealth string, bNode int64) []*pluginapi.Device {
		return []*pluginapi.Device{dev("a", pluginapi.Healthy, 0), dev("b", bHealth, bNode), dev("c", pluginapi.Healthy, 1)}
	}
	r.setBorrowedDevices(list(pluginapi.Healthy, 0))
	healthyB, sortedAll := r.device("b"), r.sortedHealthy()

	r.setBorrowedDevices(list(pluginapi.Unhealthy, 0))
	unhealthyB, sortedTwo := r.device("b"), r.sortedHealthy()
	assert.Equal(t, []string{"a", "c"}, sortedTwo)
	assert.NotSame(t, healthyB, unhealthyB)

	r.setBorrowedDevices(list(pluginapi.Healthy, 0))
	assert.Same(t, healthyB, r.device("b"), "the flip back takes the earlier value")
	assert.Same(t, &sortedAll[0], &r.sortedHealthy()[0], "the healthy IDs sorted before")
	r.setBorrowedDevices(list(pluginapi.Unhealthy, 0))
	assert.Same(t, unhealthyB, r.device("b"))
	assert.Same(t, &sortedTwo[0], &r.sortedHealthy()[0])

	// b moves to node 1 while unhealthy, then comes back healthy there.
	r.setBorrowedDevices(list(pluginapi.Unhealthy, 1))
	r.setBorrowedDevices(list(pluginapi.Healthy, 1))
	b := r.device("b")
	assert.Equal(t, pluginapi.Healthy, b.Health)
	assert.Equal(t, []int64{1}, nodeIDs(b), "the value of before the move is not taken back")
	assert.Equal(t, []string{"a", "b", "c"}, r.sortedHealthy())

	// A new list (other IDs at the same places) forgets both.
	r.setBorrowedDevices([]*pluginapi.Device{dev("x", pluginapi.Healthy, 0), dev("y", pluginapi.Unhealthy, 0), dev("z", pluginapi.Healthy, 1)})
	assert.Equal(t, []string{"x", "z"}, r.sortedHealthy(), "the same flags on other IDs")
	r.setBorrowedDevices([]*pluginapi.Device{dev("x", pluginapi.Healthy, 0), dev("y", pluginapi.Healthy, 0), dev("z", pluginapi.Healthy, 1)})
	assert.Equal(t, "y", r.device("y").ID)
	assert.Equal(t, []string{"x", "y", "z"}, r.sortedHealthy())
}
