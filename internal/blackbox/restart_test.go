package blackbox_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/podstate"
)

// A new manager on the same directory restores the allocations from the
// checkpoint (Stop writes nothing). Until the plugin is back the resource
// has capacity 0 and no hints; while sources are not ready a container
// found running passes unchecked; once the plugin is back the container
// passes with no new call.
func TestCheckpointRestoreAfterRestart(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.NUMANodes = []int{0, 1}; o.StopGracePeriod = time.Minute })
	m1 := e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0", 0), healthy("d1", 1), healthy("d2"))
	p := pod("u1", ctr("c", resGPU, 3), ctr("other", "cpu", 1))
	require.NoError(t, e.allocate(p, "c"))
	wantOpts, err := e.runOptions(p, "c")
	require.NoError(t, err)
	wantDevs := m1.GetDevices("u1", "c")
	ckPath := filepath.Join(e.dir, checkpoint.DeviceManagerKey)
	before := readFile(t, ckPath)

	pl.stop()
	e.waitCapacity(t, resGPU, 3, 0)
	require.NoError(t, m1.Stop())
	assert.Equal(t, string(before), string(readFile(t, ckPath)), "disconnect or Stop wrote the checkpoint")

	e.ready.v.Store(false)
	cmap := podstate.ContainerMap{"cid-1": {PodUID: "u1", ContainerName: "c"}}
	m2 := e.startWith(t, cmap, sets.New("cid-1"))

	got := m2.GetDevices("u1", "c")
	require.Contains(t, got, resGPU)
	assert.Equal(t, sets.KeySet(wantDevs[resGPU]), sets.KeySet(got[resGPU]))
	for id, d := range got[resGPU] {
		assert.True(t, proto.Equal(wantDevs[resGPU][id], d), "device %s: %v vs %v", id, wantDevs[resGPU][id], d)
	}
	o, err := e.runOptions(p, "c")
	require.NoError(t, err)
	require.NotNil(t, o)
	assert.ElementsMatch(t, wantOpts.Envs, o.Envs)

	// Restored resources: capacity 0/0, not allocatable devices, no hints.
	c, a, listed := capacityOf(m2, resGPU)
	assert.True(t, listed)
	assert.Zero(t, c)
	assert.Zero(t, a)
	assert.NotContains(t, m2.GetAllocatableDevices(), resGPU)
	hints := m2.GetTopologyHints(p, &p.Spec.Containers[0])
	assert.Contains(t, hints, resGPU)
	assert.Nil(t, hints[resGPU])

	// Sources not ready: the running container passes untouched; a new one does not.
	require.NoError(t, e.allocate(p, "c"))
	err = e.allocate(pod("u2", ctr("c", resGPU, 1)), "c")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrPluginNotReady)
	// Sources ready: the running container is checked too.
	e.ready.v.Store(true)
	err = e.allocate(p, "c")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrPluginNotReady)

	// The plugin comes back: no new RPC is needed.
	pl2 := e.plugin(t, "p.sock", resGPU, nil, healthy("d0", 0), healthy("d1", 1), healthy("d2"))
	require.NoError(t, e.allocate(p, "c"))
	assert.Empty(t, pl2.allocateCalls())
	e.clock.Step(time.Hour)
	_, _, removed := m2.GetCapacity()
	assert.Empty(t, removed)
}

// A restored resource whose plugin never returns disappears after the grace
// period; its allocation records stay.
func TestRestoredResourceExpires(t *testing.T) {
	dir := copyFixture(t, "sample")
	e := newEnv(t, func(o *devicemanager.Options) { o.StopGracePeriod = time.Minute })
	e.opts.SocketDir = dir
	e.dir = dir
	e.pods.add(pod("pod-uid-1", ctr("ctr", "example.com/dev", 2))) // the checkpoint's pod runs
	m := e.start(t)
	c, a, listed := capacityOf(m, "example.com/dev")
	assert.True(t, listed)
	assert.Zero(t, c)
	assert.Zero(t, a)
	e.clock.Step(time.Minute)
	_, _, removed := m.GetCapacity()
	assert.Empty(t, removed)
	e.clock.Step(time.Second)
	_, _, removed = m.GetCapacity()
	assert.Equal(t, []string{"example.com/dev"}, removed)
	require.Eventually(t, func() bool {
		_, reg, ok := tryReadCheckpoint(dir)
		_, has := reg["example.com/dev"]
		return ok && !has
	}, waitFor, tick)
	// The allocation record itself survives.
	entries, _ := readCheckpoint(t, dir)
	assert.Len(t, entries, 1)
}

// While sources are not ready only containers found running (a container ID
// of theirs in the running set) skip the admission checks.
func TestRestartNotRunningContainerChecked(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	p := pod("u1", ctr("c", resGPU, 1), ctr("d", resGPU, 1))
	require.NoError(t, e.allocate(p, "c"))
	require.NoError(t, e.allocate(p, "d"))
	pl.stop()
	e.waitCapacity(t, resGPU, 2, 0)
	require.NoError(t, e.mgr.Stop())

	e.ready.v.Store(false)
	// "c" is known but not running; "d" runs under a second ID too.
	cmap := podstate.ContainerMap{"id-c": {PodUID: "u1", ContainerName: "c"}, "id-d1": {PodUID: "u1", ContainerName: "d"}, "id-d2": {PodUID: "u1", ContainerName: "d"}}
	e.startWith(t, cmap, sets.New("id-d2"))
	err := e.allocate(p, "c")
	assert.ErrorIs(t, err, devicemanager.ErrPluginNotReady)
	assert.NoError(t, e.allocate(p, "d"))
}

// After a restart, sources not ready: a changed request is refused even for
// a running container (the kubelet checks it first); a running container
// without any record passes without a plugin call.
func TestRestartRunningContainerSkipsChecksButNotRequestChange(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 1)), "c"))
	pl.stop()
	require.NoError(t, e.mgr.Stop())

	e.ready.v.Store(false)
	cmap := podstate.ContainerMap{"id1": {PodUID: "u1", ContainerName: "c"}, "id2": {PodUID: "u2", ContainerName: "c"}}
	e.startWith(t, cmap, sets.New("id1", "id2"))
	pl2 := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	err := e.allocate(pod("u1", ctr("c", resGPU, 2)), "c")
	assert.ErrorIs(t, err, devicemanager.ErrRequestChanged)
	assert.NoError(t, e.allocate(pod("u2", ctr("c", resGPU, 1)), "c"))
	assert.Empty(t, pl2.allocateCalls())
	assert.Empty(t, e.mgr.GetDevices("u2", "c"))
}

// Restored allocations keep their devices in use once the plugin is back.
func TestRestoredAllocationsStayAllocated(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"), healthy("d2"))
	p := pod("u1", ctr("c", resGPU, 2))
	require.NoError(t, e.allocate(p, "c"))
	held := ids(e.mgr, "u1", "c", resGPU)
	pl.stop()
	require.NoError(t, e.mgr.Stop())

	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"), healthy("d2"))
	err := e.allocate(pod("u2", ctr("c", resGPU, 2)), "c")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrInsufficientDevices)
	assert.Contains(t, err.Error(), "Requested: 2, Available: 1")
	require.NoError(t, e.allocate(pod("u3", ctr("c", resGPU, 1)), "c"))
	assert.Empty(t, sets.New(held...).Intersection(sets.New(ids(e.mgr, "u3", "c", resGPU)...)))
}
