package blackbox_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
)

// UpdateAllocatedResourcesStatus fills the app containers' statuses with
// their devices' health, replacing the entry of the same resource; a device
// missing from the plugin's list is reported Healthy, as by the kubelet.
func TestUpdateAllocatedResourcesStatus(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d1"), healthy("d2"))
	p := pod("u1", ctr("c", resGPU, 2), ctr("plain", "cpu", 1))
	require.NoError(t, e.allocate(p, "c"))
	pl.update(healthy("d1"), unhealthy("d2"))
	e.waitCapacity(t, resGPU, 2, 1)

	keep := v1.ResourceStatus{Name: "example.com/other", Resources: []v1.ResourceHealth{{ResourceID: "x", Health: v1.ResourceHealthStatusUnknown}}}
	st := &v1.PodStatus{
		ContainerStatuses: []v1.ContainerStatus{
			{Name: "c", AllocatedResourcesStatus: []v1.ResourceStatus{keep, {Name: resGPU}}},
			{Name: "plain"},
		},
		InitContainerStatuses: []v1.ContainerStatus{{Name: "c"}},
	}
	e.mgr.UpdateAllocatedResourcesStatus(p, st)
	got := st.ContainerStatuses[0].AllocatedResourcesStatus
	require.Len(t, got, 2, "same-name entry must be replaced, others kept: %+v", got)
	assert.Equal(t, keep, got[0])
	assert.Equal(t, v1.ResourceName(resGPU), got[1].Name)
	assert.ElementsMatch(t, []v1.ResourceHealth{
		{ResourceID: "d1", Health: v1.ResourceHealthStatusHealthy},
		{ResourceID: "d2", Health: v1.ResourceHealthStatusUnhealthy},
	}, got[1].Resources)
	assert.Empty(t, st.ContainerStatuses[1].AllocatedResourcesStatus)
	assert.Empty(t, st.InitContainerStatuses[0].AllocatedResourcesStatus, "init container statuses are not touched")

	// d2 vanishes from the list: reported Healthy.
	pl.update(healthy("d1"))
	e.waitCapacity(t, resGPU, 1, 1)
	st2 := &v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: "c"}}}
	e.mgr.UpdateAllocatedResourcesStatus(p, st2)
	require.Len(t, st2.ContainerStatuses[0].AllocatedResourcesStatus, 1)
	assert.ElementsMatch(t, []v1.ResourceHealth{
		{ResourceID: "d1", Health: v1.ResourceHealthStatusHealthy},
		{ResourceID: "d2", Health: v1.ResourceHealthStatusHealthy},
	}, st2.ContainerStatuses[0].AllocatedResourcesStatus[0].Resources)
}

func nextUpdate(t *testing.T, m *devicemanager.ManagerImpl) []string {
	t.Helper()
	select {
	case u := <-m.Updates():
		return sets.List(sets.New(u.PodUIDs...))
	case <-time.After(waitFor):
		t.Fatal("no update on Updates()")
		return nil
	}
}

// Updates() names the owners of devices whose health changed (or that came
// back); vanished devices and unchanged lists name nobody; owners are looked
// up per resource.
func TestUpdatesDeliverOwningPods(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	gpu := e.plugin(t, "g.sock", resGPU, nil, healthy("same"), healthy("g2"))
	nic := e.plugin(t, "n.sock", resNIC, nil, healthy("same"))
	pl := gpu
	u1 := pod("u1", ctr("c", resGPU, 1))
	u2 := pod("u2", ctr("c", resNIC, 1))
	u3 := pod("u3", ctr("c", resGPU, 1))
	require.NoError(t, e.allocate(u1, "c"))
	require.NoError(t, e.allocate(u2, "c"))
	require.NoError(t, e.allocate(u3, "c"))
	u1dev := ids(e.mgr, "u1", "c", resGPU)[0]
	u3dev := ids(e.mgr, "u3", "c", resGPU)[0]

	// The nic's "same" belongs to u2 only (IDs are unique per resource).
	nic.update(unhealthy("same"))
	e.waitCapacity(t, resNIC, 1, 0)
	assert.Equal(t, []string{"u2"}, nextUpdate(t, e.mgr))

	pl.update(unhealthy(u1dev), healthy(u3dev))
	e.waitCapacity(t, resGPU, 2, 1)
	assert.Equal(t, []string{"u1"}, nextUpdate(t, e.mgr))

	// Unchanged list, then u1's device vanishes: nothing; then u3's changes.
	pl.update(healthy(u3dev), unhealthy(u1dev))
	pl.update(healthy(u3dev))
	e.waitCapacity(t, resGPU, 1, 1)
	pl.update(unhealthy(u3dev))
	e.waitCapacity(t, resGPU, 1, 0)
	assert.Equal(t, []string{"u3"}, nextUpdate(t, e.mgr))

	// u1's device comes back: its owner is told.
	pl.update(unhealthy(u3dev), healthy(u1dev))
	e.waitCapacity(t, resGPU, 2, 1)
	assert.Equal(t, []string{"u1"}, nextUpdate(t, e.mgr))
	select {
	case u := <-e.mgr.Updates():
		t.Fatalf("unexpected extra update %v", u.PodUIDs)
	default:
	}
}

// A slow consumer of Updates() loses no pod UID (the kubelet drops updates
// once its buffer of 100 is full).
func TestUpdatesNeverLoseUIDs(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	const n = 120
	devs := make([]*pluginapi.Device, 0, n)
	for i := range n {
		devs = append(devs, healthy(fmt.Sprintf("d%03d", i)))
	}
	pl := e.plugin(t, "p.sock", resGPU, nil, devs...)
	owner := map[string]string{}
	for i := range n {
		uid := fmt.Sprintf("p%03d", i)
		require.NoError(t, e.allocate(pod(uid, ctr("c", resGPU, 1)), "c"))
		owner[ids(e.mgr, uid, "c", resGPU)[0]] = uid
	}
	want := sets.New[string]()
	for i := range n {
		devs[i] = unhealthy(devs[i].ID)
		pl.update(devs...)
		e.waitCapacity(t, resGPU, n, int64(n-i-1))
		want.Insert(owner[devs[i].ID])
	}
	got := sets.New[string]()
	require.Eventually(t, func() bool {
		for {
			select {
			case u := <-e.mgr.Updates():
				got.Insert(u.PodUIDs...)
			default:
				return got.Equal(want)
			}
		}
	}, waitFor, tick, "lost %d pod UIDs", want.Difference(got).Len())
}

// UpdatePluginResources raises allocatable to at least the devices allocated
// node-wide, for a pod that holds devices; otherwise it changes nothing.
func TestUpdatePluginResources(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	e.plugin(t, "g.sock", resGPU, nil, healthy("g1"), healthy("g2"))
	e.plugin(t, "n.sock", resNIC, nil, healthy("n1"))
	u1 := pod("u1", ctr("c", resGPU, 1, resNIC, 1))
	u2 := pod("u2", ctr("c", resGPU, 1))
	require.NoError(t, e.allocate(u1, "c"))
	require.NoError(t, e.allocate(u2, "c"))

	q := func(n int64) resource.Quantity { return *resource.NewQuantity(n, resource.DecimalSI) }
	in := v1.ResourceList{v1.ResourceName(resNIC): q(2), v1.ResourceCPU: q(4)}
	orig := in.DeepCopy()
	out := e.mgr.UpdatePluginResources(in, u1)
	gq, nq, cq := out[v1.ResourceName(resGPU)], out[v1.ResourceName(resNIC)], out[v1.ResourceCPU]
	assert.Equal(t, int64(2), gq.Value(), "raised to the node-wide allocated count")
	assert.Equal(t, int64(2), nq.Value(), "larger value kept")
	assert.Equal(t, int64(4), cq.Value())

	in2 := v1.ResourceList{v1.ResourceName(resGPU): q(1)}
	out = e.mgr.UpdatePluginResources(in2, u1)
	gq = out[v1.ResourceName(resGPU)]
	assert.Equal(t, int64(2), gq.Value())
	nq = out[v1.ResourceName(resNIC)]
	assert.Equal(t, int64(1), nq.Value())

	none := pod("u9", ctr("c", "cpu", 1))
	out = e.mgr.UpdatePluginResources(orig.DeepCopy(), none)
	assert.Equal(t, orig, out, "pod without devices: unchanged")
}

// The plugin-watcher path: version and name validation with the kubelet's
// messages, registration at the endpoint given, deregistration.
func TestWatcherHandler(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	h := e.mgr.GetWatcherHandler()

	assert.NoError(t, h.ValidatePlugin(resGPU, "/x.sock", []string{"v1alpha1", "v1beta1"}))
	err := h.ValidatePlugin(resGPU, "/x.sock", []string{"v1alpha1"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "manager version, v1beta1, is not among plugin supported versions [v1alpha1]")
	err = h.ValidatePlugin("bad", "/x.sock", []string{"v1beta1"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `invalid name of device plugin socket: the ResourceName "bad" is invalid`)

	// The endpoint is used verbatim (an absolute path, anywhere).
	other := tempDir(t)
	pl := newFakePlugin(t, other, "w.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	pl.start(t)
	timeout := 5 * time.Second
	require.NoError(t, h.RegisterPlugin(resGPU, pl.sock, []string{"v1beta1"}, &timeout))
	e.waitCapacity(t, resGPU, 2, 2)
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 1)), "c"))
	assert.Len(t, pl.allocateCalls(), 1)

	h.DeRegisterPlugin(resGPU, pl.sock)
	e.waitCapacity(t, resGPU, 2, 0)
	require.Eventually(t, func() bool { return pl.openStreams() == 0 }, waitFor, tick, "stream not closed by DeRegisterPlugin")
	h.DeRegisterPlugin(resGPU, filepath.Join(other, "unknown.sock"))

	err = h.RegisterPlugin(resNIC, filepath.Join(other, "nobody.sock"), []string{"v1beta1"}, &timeout)
	assert.Error(t, err)

	// Registered again by the watcher: allocatable again.
	require.NoError(t, h.RegisterPlugin(resGPU, pl.sock, []string{"v1beta1"}, nil))
	e.waitCapacity(t, resGPU, 2, 2)
}

// GetDevices is the podresources view: a device on two NUMA nodes reports
// both; a device with an empty node list has no topology; values carry only
// the topology.
func TestGetDevicesCarriesOnlyTopology(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.NUMANodes = []int{0, 1} })
	e.start(t)
	empty := healthy("e")
	empty.Topology = &pluginapi.TopologyInfo{}
	e.plugin(t, "p.sock", resGPU, nil, healthy("m", 0, 1), empty, healthy("s", 1))
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 3)), "c"))
	got := e.mgr.GetDevices("u1", "c")[resGPU]
	require.Len(t, got, 3)
	nodes := func(id string) []int64 {
		var out []int64
		for _, n := range got[id].GetTopology().GetNodes() {
			out = append(out, n.ID)
		}
		slices.Sort(out)
		return out
	}
	assert.Equal(t, []int64{0, 1}, nodes("m"))
	assert.Equal(t, []int64{1}, nodes("s"))
	assert.Nil(t, got["e"].GetTopology())
	for id, d := range got {
		assert.Empty(t, d.GetID(), "%s: only Topology is set", id)
		assert.Empty(t, d.GetHealth(), "%s: only Topology is set", id)
	}
	entries, _ := readCheckpoint(t, e.dir)
	require.Len(t, entries, 1)
	assert.Equal(t, checkpointIDs{-1: {"e"}, 0: {"m"}, 1: {"m", "s"}}, checkpointIDs(entries[0].DeviceIDs))
	assert.Nil(t, e.mgr.GetDevices("u1", "nope"))
	assert.Nil(t, e.mgr.GetDevices("nope", "c"))
}

type checkpointIDs map[int64][]string

// Getters hand out copies: a caller mutating them changes nothing.
func TestGettersReturnCopies(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 1)), "c"))
	all := e.mgr.GetAllocatableDevices()
	delete(all[resGPU], "d0")
	delete(all, resGPU)
	assert.Len(t, e.mgr.GetAllocatableDevices()[resGPU], 2)
	got := e.mgr.GetDevices("u1", "c")
	delete(got, resGPU)
	assert.Len(t, e.mgr.GetDevices("u1", "c")[resGPU], 1)
}

// A change of the Health string notifies the owner, even between two
// unhealthy values.
func TestUpdatesOnAnyHealthStringChange(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 2)), "c"))
	pl.update(unhealthy("d0"), healthy("d1"))
	e.waitCapacity(t, resGPU, 2, 1)
	assert.Equal(t, []string{"u1"}, nextUpdate(t, e.mgr))
	pl.update(dev("d0", "Unknown"), healthy("d1"), healthy("d2"))
	e.waitCapacity(t, resGPU, 3, 2)
	assert.Equal(t, []string{"u1"}, nextUpdate(t, e.mgr))
}
