package blackbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
)

func fixedResponse(r *pluginapi.ContainerAllocateResponse) func(context.Context, *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	return func(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		out := &pluginapi.AllocateResponse{}
		for range req.ContainerRequests {
			out.ContainerResponses = append(out.ContainerResponses, r)
		}
		return out, nil
	}
}

// Run options merge the answers of every resource: the first wins per env
// key, container path and annotation; Mount.Name is the container path; CDI
// names are deduplicated, each answer's order kept.
func TestRunOptionsMerging(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	gpu := e.plugin(t, "g.sock", resGPU, nil, healthy("g0"))
	nic := e.plugin(t, "n.sock", resNIC, nil, healthy("n0"))
	gpu.setAllocate(fixedResponse(&pluginapi.ContainerAllocateResponse{
		Envs:        map[string]string{"A": "1", "SHARED": "x"},
		Mounts:      []*pluginapi.Mount{{ContainerPath: "/c1", HostPath: "/h1", ReadOnly: true}},
		Devices:     []*pluginapi.DeviceSpec{{ContainerPath: "/dev/c1", HostPath: "/dev/h1", Permissions: "rw"}},
		Annotations: map[string]string{"an1": "v"},
		CdiDevices:  []*pluginapi.CDIDevice{{Name: "v.com/c=1"}, {Name: "v.com/c=2"}},
	}))
	nic.setAllocate(fixedResponse(&pluginapi.ContainerAllocateResponse{
		Envs:        map[string]string{"B": "2", "SHARED": "x"},
		Mounts:      []*pluginapi.Mount{{ContainerPath: "/c1", HostPath: "/h1", ReadOnly: true}, {ContainerPath: "/c2", HostPath: "/h2"}},
		Devices:     []*pluginapi.DeviceSpec{{ContainerPath: "/dev/c1", HostPath: "/dev/h1", Permissions: "rw"}, {ContainerPath: "/dev/c2", HostPath: "/dev/h2", Permissions: "r"}},
		Annotations: map[string]string{"an1": "v", "an2": "w"},
		CdiDevices:  []*pluginapi.CDIDevice{{Name: "v.com/c=2"}, {Name: "v.com/c=3"}},
	}))
	p := pod("u1", ctr("c", resGPU, 1, resNIC, 1), ctr("plain", "cpu", 1))
	require.NoError(t, e.allocate(p, "c"))
	o, err := e.runOptions(p, "c")
	require.NoError(t, err)
	require.NotNil(t, o)
	assert.ElementsMatch(t, []devicemanager.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"}, {Name: "SHARED", Value: "x"}}, o.Envs)
	assert.ElementsMatch(t, []devicemanager.Mount{
		{Name: "/c1", ContainerPath: "/c1", HostPath: "/h1", ReadOnly: true},
		{Name: "/c2", ContainerPath: "/c2", HostPath: "/h2"},
	}, o.Mounts)
	assert.ElementsMatch(t, []devicemanager.DeviceInfo{
		{PathOnHost: "/dev/h1", PathInContainer: "/dev/c1", Permissions: "rw"},
		{PathOnHost: "/dev/h2", PathInContainer: "/dev/c2", Permissions: "r"},
	}, o.Devices)
	assert.ElementsMatch(t, []devicemanager.Annotation{{Name: "an1", Value: "v"}, {Name: "an2", Value: "w"}}, o.Annotations)
	assert.ElementsMatch(t, []devicemanager.CDIDevice{{Name: "v.com/c=1"}, {Name: "v.com/c=2"}, {Name: "v.com/c=3"}}, o.CDIDevices)
	names := make([]string, 0, len(o.CDIDevices))
	for _, c := range o.CDIDevices {
		names = append(names, c.Name)
	}
	// Whichever resource came first, each response's order is kept.
	assert.Contains(t, [][]string{{"v.com/c=1", "v.com/c=2", "v.com/c=3"}, {"v.com/c=2", "v.com/c=3", "v.com/c=1"}}, names)

	// A container without device resources, and unknown pods/containers: nil, nil.
	o, err = e.runOptions(p, "plain")
	assert.NoError(t, err)
	assert.Nil(t, o)
	q := pod("nobody", ctr("c", "cpu", 1))
	o, err = e.runOptions(q, "c")
	assert.NoError(t, err)
	assert.Nil(t, o)
}

// GetDeviceRunContainerOptions allocates a missing record of an active pod
// (a race at node restart); an inactive pod gets nothing.
func TestRunOptionsReallocatesMissingRecord(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))

	inactive := pod("gone", ctr("c", resGPU, 1))
	o, err := e.runOptions(inactive, "c")
	assert.NoError(t, err)
	assert.Nil(t, o)
	assert.Empty(t, pl.allocateCalls())

	active := pod("u1", ctr("c", resGPU, 1))
	e.pods.set(active)
	o, err = e.runOptions(active, "c")
	require.NoError(t, err)
	require.NotNil(t, o)
	assert.Len(t, pl.allocateCalls(), 1)
	assert.Len(t, o.Envs, 1)
	assert.Len(t, ids(e.mgr, "u1", "c", resGPU), 1)
}

// PreStartContainer is called, with the container's devices, when run
// options are fetched for a plugin that asks for it; not for a request of
// zero; its failure is reported with the kubelet's text.
func TestPreStartContainer(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, &pluginapi.DevicePluginOptions{PreStartRequired: true},
		healthy("d2"), healthy("d0"), healthy("d1"))
	pl.setAllocate(fixedResponse(&pluginapi.ContainerAllocateResponse{
		Envs:   map[string]string{"E": "1"},
		Mounts: []*pluginapi.Mount{{ContainerPath: "/m1", HostPath: "/h1"}, {ContainerPath: "/m2", HostPath: "/h2"}},
		Devices: []*pluginapi.DeviceSpec{
			{ContainerPath: "/dev/1", HostPath: "/dev/h1"}, {ContainerPath: "/dev/2", HostPath: "/dev/h2"}, {ContainerPath: "/dev/3", HostPath: "/dev/h3"},
		},
	}))
	p := pod("u1", ctr("c", resGPU, 2))
	require.NoError(t, e.allocate(p, "c"))
	assert.Empty(t, pl.preStartCalls(), "PreStart before the container starts")
	o, err := e.runOptions(p, "c")
	require.NoError(t, err)
	require.NotNil(t, o)
	assert.Len(t, o.Devices, 3)
	assert.Len(t, o.Mounts, 2)
	assert.Len(t, o.Envs, 1)
	calls := pl.preStartCalls()
	require.Len(t, calls, 1)
	assert.Equal(t, ids(e.mgr, "u1", "c", resGPU), sortedCopy(calls[0].DevicesIds))

	// Zero quantity: no PreStart, no error, no options.
	z := pod("z", ctr("c", resGPU, 0))
	require.NoError(t, e.allocate(z, "c"))
	o, err = e.runOptions(z, "c")
	assert.NoError(t, err)
	assert.Nil(t, o)
	assert.Len(t, pl.preStartCalls(), 1)

	// A PreStart failure is reported with the kubelet's text.
	pl.setPreStart(func(context.Context, *pluginapi.PreStartContainerRequest) error { return errors.New("reset failed") })
	_, err = e.runOptions(p, "c")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrPluginCall)
	assert.Contains(t, err.Error(), "device plugin PreStartContainer rpc failed with err:")
	assert.Contains(t, err.Error(), "reset failed")
}

func TestPreStartTimeout(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.PreStartTimeout = 200 * time.Millisecond })
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, &pluginapi.DevicePluginOptions{PreStartRequired: true}, healthy("d0"))
	pl.setPreStart(func(ctx context.Context, _ *pluginapi.PreStartContainerRequest) error {
		<-ctx.Done()
		return ctx.Err()
	})
	p := pod("u1", ctr("c", resGPU, 1))
	require.NoError(t, e.allocate(p, "c"))
	done := make(chan error, 1)
	go func() {
		_, err := e.runOptions(p, "c")
		done <- err
	}()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.ErrorIs(t, err, devicemanager.ErrPluginCall)
	case <-time.After(waitFor):
		t.Fatal("PreStartTimeout not honoured")
	}
}

// PreStartContainer comes before the re-allocation of a missing record, so
// a missing record of a plugin that asks for it is an error.
func TestPreStartMissingRecord(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	e.plugin(t, "p.sock", resGPU, &pluginapi.DevicePluginOptions{PreStartRequired: true}, healthy("d0"))
	p := pod("u1", ctr("c", resGPU, 1))
	e.pods.set(p)
	_, err := e.runOptions(p, "c")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no devices found allocated in local cache for pod u1, container c, resource vendor.com/gpu")
}

// The endpoint of a disconnected plugin is stopped; PreStartContainer
// through it fails with the stopped-endpoint error.
func TestPreStartOnStoppedEndpoint(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, &pluginapi.DevicePluginOptions{PreStartRequired: true}, healthy("d0"))
	p := pod("u1", ctr("c", resGPU, 1))
	require.NoError(t, e.allocate(p, "c"))
	pl.stop()
	e.waitCapacity(t, resGPU, 1, 0)
	_, err := e.runOptions(p, "c")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrEndpointStopped)
	assert.Contains(t, err.Error(), "has been stopped")
}

// Once the grace period removed the endpoint, a container holding its
// devices gets the kubelet's "endpoint not found in cache".
func TestRunOptionsEndpointGone(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.StopGracePeriod = time.Minute })
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"))
	p := pod("u1", ctr("c", resGPU, 1))
	require.NoError(t, e.allocate(p, "c"))
	pl.stop()
	e.waitCapacity(t, resGPU, 1, 0)
	e.clock.Step(2 * time.Minute)
	_, _, removed := e.mgr.GetCapacity()
	require.Equal(t, []string{resGPU}, removed)
	_, err := e.runOptions(p, "c")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrUnknownPlugin)
	assert.Contains(t, err.Error(), "endpoint not found in cache for a registered resource: vendor.com/gpu")
}

// UpdateAllocatedDevices drops the records of inactive pods, does nothing
// until sources are ready, and writes no checkpoint.
func TestUpdateAllocatedDevicesGC(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	p1 := pod("u1", ctr("c", resGPU, 2))
	require.NoError(t, e.allocate(p1, "c"))
	before := readFile(t, e.dir+"/kubelet_internal_checkpoint")

	e.ready.v.Store(false)
	e.pods.set()
	e.mgr.UpdateAllocatedDevices()
	assert.Len(t, ids(e.mgr, "u1", "c", resGPU), 2, "GC ran while sources not ready")

	e.ready.v.Store(true)
	e.mgr.UpdateAllocatedDevices()
	assert.Empty(t, e.mgr.GetDevices("u1", "c"))
	o, err := e.runOptions(p1, "c")
	assert.NoError(t, err)
	assert.Nil(t, o)
	assert.Equal(t, before, readFile(t, e.dir+"/kubelet_internal_checkpoint"), "GC wrote the checkpoint")
	require.NoError(t, e.allocate(pod("u2", ctr("c", resGPU, 2)), "c"))
}

// On conflicting answers the first wins per env key and container path;
// CDI names are deduplicated within and across answers.
func TestRunOptionsFirstWinsOnConflict(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	gpu := e.plugin(t, "g.sock", resGPU, nil, healthy("g0"))
	nic := e.plugin(t, "n.sock", resNIC, nil, healthy("n0"))
	gpu.setAllocate(fixedResponse(&pluginapi.ContainerAllocateResponse{
		Envs:       map[string]string{"X": "1"},
		Mounts:     []*pluginapi.Mount{{ContainerPath: "/c", HostPath: "/g"}},
		Devices:    []*pluginapi.DeviceSpec{{ContainerPath: "/dev/x", HostPath: "/dev/g"}},
		CdiDevices: []*pluginapi.CDIDevice{{Name: "v/c=1"}, {Name: "v/c=1"}},
	}))
	nic.setAllocate(fixedResponse(&pluginapi.ContainerAllocateResponse{
		Envs:    map[string]string{"X": "2"},
		Mounts:  []*pluginapi.Mount{{ContainerPath: "/c", HostPath: "/n"}},
		Devices: []*pluginapi.DeviceSpec{{ContainerPath: "/dev/x", HostPath: "/dev/n"}},
	}))
	p := pod("u1", ctr("c", resGPU, 1, resNIC, 1))
	require.NoError(t, e.allocate(p, "c"))
	o, err := e.runOptions(p, "c")
	require.NoError(t, err)
	require.NotNil(t, o)
	assert.Len(t, o.Envs, 1)
	assert.Len(t, o.Mounts, 1)
	assert.Len(t, o.Devices, 1)
	assert.Equal(t, []devicemanager.CDIDevice{{Name: "v/c=1"}}, o.CDIDevices)
	// Consistent winner: all from the same resource or not, but one each.
	assert.Contains(t, []string{"1", "2"}, o.Envs[0].Value)
}
