package devicemanager

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/topology"
)

// The census behind GetTopologyHints, kept up to date as devices are
// allocated, released and change health, answers as a census counted afresh
// from the same devices, with the free devices found from scratch.
func TestHintsCensusStaysExact(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.NUMANodes = []int{0, 1, 2} }).start()
	var devs []*pluginapi.Device
	for i := range 12 {
		devs = append(devs, dev(fmt.Sprintf("d%02d", i), pluginapi.Healthy, int64(i%3)))
	}
	p := h.registered(res1, devs)
	rng := rand.New(rand.NewPCG(1, 2))
	var live []string
	for step := range 60 {
		switch k := rng.IntN(10); {
		case k < 5: // admit
			uid := fmt.Sprintf("p%d", step)
			pod := newPod(uid, ctr("app", res1, 1+rng.IntN(2)))
			h.pods.add(pod)
			if h.admit(pod) == nil {
				live = append(live, uid)
			}
		case k < 8 && len(live) > 0: // release
			i := rng.IntN(len(live))
			h.pods.remove(types.UID(live[i]))
			live = append(live[:i], live[i+1:]...)
			h.m.UpdateAllocatedDevices()
		default: // health flip
			for _, d := range devs {
				if rng.IntN(4) == 0 {
					if d.Health == pluginapi.Healthy {
						d.Health = pluginapi.Unhealthy
					} else {
						d.Health = pluginapi.Healthy
					}
				}
			}
			list := devs
			if rng.IntN(2) == 0 {
				// A repeated device: the manager keeps no list in order
				// and walks its map instead.
				dup := &pluginapi.Device{ID: devs[0].ID, Health: devs[0].Health, Topology: devs[0].Topology}
				list = append(slices.Clone(devs), dup)
			}
			p.Update(list)
			h.waitDevices(res1, devs)
		}
		for request := 1; request <= 3; request++ {
			pod := newPod("probe", ctr("app", res1, request))
			got := h.m.GetTopologyHints(pod, &pod.Spec.Containers[0])[res1]
			h.m.mu.Lock()
			want := freshHints(h.m.core, h.m.core.resources[res1], h.opts.NUMANodes, request)
			h.m.mu.Unlock()
			require.Equal(t, want, got, "step %d request %d", step, request)
		}
		checkAvailable(t, h.m, res1)
	}
}

// freshHints returns the hints of a request of request devices of r, with no
// devices held or reusable, from a census counted now from r's devices: its
// healthy devices are those available counts free from scratch and none is
// allocated, so neither the manager's cached census nor its view of the free
// devices takes part. Expects the manager's lock held.
func freshHints(c *core, r *resourceState, machine []int, request int) []topology.Hint {
	devices := r.deviceMap()
	fresh := topology.CountDevices(maps.All(devices), len(devices), available(c, r).Has)
	return fresh.Hints(machine, nil, sets.New[string](), nil, request)
}

// waitDevices waits until the manager holds exactly devs for res, with their
// health. Capacity alone is no sign that a list was applied: a new list may
// have as many healthy devices as the one before it.
func (h *harness) waitDevices(res string, devs []*pluginapi.Device) {
	h.t.Helper()
	h.eventually(func() bool {
		h.m.mu.Lock()
		defer h.m.mu.Unlock()
		r := h.m.core.resources[res]
		if r == nil || len(r.devices) != len(devs) {
			return false
		}
		for _, d := range devs {
			if got := r.device(d.ID); got == nil || got.Health != d.Health {
				return false
			}
		}
		return true
	}, "the manager holds the %d devices of %s as sent", len(devs), res)
}

// checkAvailable compares the manager's free devices of resource (what an
// admission selects from) with a count from scratch.
func checkAvailable(t *testing.T, m *ManagerImpl, resource string) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.core.resources[resource]
	want := available(m.core, r)
	view := m.core.free(r)
	require.Equal(t, want.Len(), view.Len(), "free devices counted")
	for id := range r.deviceMap() {
		require.Equal(t, want.Has(id), view.Has(id), "device %s counted free", id)
	}
}

// available returns, from scratch, the healthy devices of r that no record or
// reservation holds. Expects m.mu held.
func available(c *core, r *resourceState) sets.Set[string] {
	out := sets.New[string]()
	for id, d := range r.deviceMap() {
		if d.Health == pluginapi.Healthy && !r.down && !c.ledger.IsAllocated(r.name, id) {
			out.Insert(id)
		}
	}
	return out
}

// A list that moves devices between NUMA nodes, applied in place, drops the
// census: admissions with an affinity are tiered by the new nodes, and hints
// count them, unhealthy devices included.
func TestCensusFollowsTopologyOnlyUpdates(t *testing.T) {
	c := newCore(limits{})
	r := newResource(res1)
	c.resources[res1] = r
	r.setDevices([]*pluginapi.Device{dev("a", pluginapi.Healthy, 0), dev("b", pluginapi.Healthy, 1), dev("c", pluginapi.Unhealthy, 0)})
	node0 := topology.BitMask(1)
	c.census(r)

	// Healthy devices swap nodes.
	r.setDevices([]*pluginapi.Device{dev("a", pluginapi.Healthy, 1), dev("b", pluginapi.Healthy, 0), dev("c", pluginapi.Unhealthy, 0)})
	got := c.census(r).Tiers(&node0, r.sortedHealthy(), c.free(r).Has)
	require.Equal(t, []string{"b"}, got.Aligned)
	require.Equal(t, []string{"a"}, got.Unaligned)

	// An unhealthy device gains a node, and its health string changes too:
	// the resource becomes topology-aware.
	r = newResource(res2)
	c.resources[res2] = r
	r.setDevices([]*pluginapi.Device{dev("a", pluginapi.Healthy), dev("c", pluginapi.Unhealthy)})
	c.census(r)
	r.setDevices([]*pluginapi.Device{dev("a", pluginapi.Healthy), dev("c", "Unknown", 0)})
	want := freshHints(c, r, []int{0, 1}, 1)
	require.NotNil(t, want, "the resource is topology-aware now")
	require.Equal(t, want, c.census(r).Hints([]int{0, 1}, nil, sets.New[string](), nil, 1))
}
