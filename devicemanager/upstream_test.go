package devicemanager

// The upstream device manager tests (the kubelet's manager_test.go)
// rewritten against devmgr's public surface: real plugins (plugintest) over
// real unix sockets, registered through kubelet.sock or through the
// plugin-watcher handler ("probe mode"). Each test names the upstream test it
// mirrors. Where devmgr deliberately differs from the kubelet
// (docs/ARCHITECTURE.md lists where), the test
// asserts devmgr's behaviour and says so. Allocation tests are in
// upstream_alloc_test.go, topology hint tests in upstream_hints_test.go.
// TestLifecycleAllocate and TestLifecycleAllocatePod have no counterpart: our
// Allocate takes no operation argument and there is no AllocatePod.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	regapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/plugintest"
)

const (
	res3    = "domain2.com/resource3"
	healthy = pluginapi.Healthy
	sick    = pluginapi.Unhealthy
)

// endpointName makes a plugin serve on, and register, the given socket name.
func endpointName(name string) func(*plugintest.Options) {
	return func(o *plugintest.Options) { o.Endpoint = name }
}

// withOptions sets the options a plugin returns from GetDevicePluginOptions.
func withOptions(preStart, preferred bool) func(*plugintest.Options) {
	return func(o *plugintest.Options) {
		o.PreStartRequired = preStart
		o.GetPreferredAllocationAvailable = preferred
	}
}

// probe registers p the way the kubelet's plugin watcher does: p serves its
// pluginregistration socket in a fresh directory; the watcher asks GetInfo,
// validates and registers the plugin through GetWatcherHandler, and tells the
// plugin the outcome with NotifyRegistrationStatus. It returns the error of
// validation or registration.
func (h *harness) probe(p *plugintest.Plugin) error {
	h.t.Helper()
	dir, err := os.MkdirTemp("", "dr")
	require.NoError(h.t, err)
	h.t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(h.t, p.ServeRegistry(dir))

	conn, err := grpc.NewClient("unix://"+p.RegistrySocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(h.t, err)
	defer conn.Close()
	client := regapi.NewRegistrationClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	info, err := client.GetInfo(ctx, &regapi.InfoRequest{}, grpc.WaitForReady(true))
	require.NoError(h.t, err)
	require.Equal(h.t, regapi.DevicePlugin, info.GetType())

	handler := h.m.GetWatcherHandler()
	err = handler.ValidatePlugin(info.GetName(), info.GetEndpoint(), info.GetSupportedVersions())
	if err == nil {
		timeout := waitTimeout
		err = handler.RegisterPlugin(info.GetName(), info.GetEndpoint(), info.GetSupportedVersions(), &timeout)
	}
	st := &regapi.RegistrationStatus{PluginRegistered: err == nil}
	if err != nil {
		st.Error = err.Error()
	}
	_, notifyErr := client.NotifyRegistrationStatus(ctx, st)
	require.NoError(h.t, notifyErr)
	return err
}

// probed starts a plugin, registers it through the plugin watcher path and
// waits until the manager sees its whole device list.
func (h *harness) probed(res string, devs []*pluginapi.Device, tune ...func(*plugintest.Options)) *plugintest.Plugin {
	h.t.Helper()
	p := h.plugin(res, devs, tune...)
	require.NoError(h.t, h.probe(p))
	h.waitCapacity(res, int64(len(devs)), int64(countHealthy(devs)))
	return p
}

// nextUpdate returns the next message of Updates, failing the test after
// waitTimeout.
func (h *harness) nextUpdate() ResourceUpdate {
	h.t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	select {
	case u, ok := <-h.m.Updates():
		require.True(h.t, ok, "Updates closed")
		return u
	case <-timer.C:
		require.FailNow(h.t, "no message on Updates")
		return ResourceUpdate{}
	}
}

// stepUntilRemoved advances the fake clock past the grace period until
// GetCapacity removes res, and returns what that call reported removed. The
// step is repeated because the disconnect that stops the endpoint (and takes
// its stop time from the clock) happens on the manager's own goroutine.
func (h *harness) stepUntilRemoved(res string) []string {
	h.t.Helper()
	var removed []string
	h.eventually(func() bool {
		h.clock.Step(DefaultStopGracePeriod + time.Second)
		_, _, removed = h.m.GetCapacity()
		return slices.Contains(removed, res)
	}, "GetCapacity removes %s", res)
	return removed
}

// waitDeviceTopology waits until the manager's copy of device id of res
// reports NUMA node numa: the sign that a marker message was processed.
func (h *harness) waitDeviceTopology(res, id string, numa int64) {
	h.t.Helper()
	h.eventually(func() bool {
		d := h.m.GetAllocatableDevices()[res][id]
		return d != nil && d.GetTopology() != nil && len(d.GetTopology().GetNodes()) == 1 &&
			d.GetTopology().GetNodes()[0].GetID() == numa
	}, "device %s of %s on NUMA node %d", id, res, numa)
}

func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

func quantity(n int64) resource.Quantity { return *resource.NewQuantity(n, resource.DecimalSI) }

// Mirrors TestNewManagerImpl: an absolute directory and no topology make a
// valid manager. Ours also answers its getters before Start and touches no
// files until Start.
func TestNewManagerImplWithAbsoluteDirAndNoTopology(t *testing.T) {
	dir, err := os.MkdirTemp("", "dm")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	m, err := NewManagerImpl(Options{SocketDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, m.Stop()) })

	c, a, removed := m.GetCapacity()
	assert.Empty(t, c)
	assert.Empty(t, a)
	assert.Empty(t, removed)
	assert.Empty(t, m.GetAllocatableDevices())
	pod := newPod("p", ctr("c", res1, 1))
	assert.Empty(t, m.GetTopologyHints(pod, &pod.Spec.Containers[0]))
	assert.Error(t, m.HealthCheck(), "not serving before Start")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "NewManagerImpl writes nothing")
}

// Mirrors TestNewManagerImplStart: a started manager serves a plugin; Stop
// ends the plugin's stream and removes kubelet.sock, and a second Stop
// succeeds too.
func TestStartServesPluginAndStopIsIdempotent(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("d", 2))
	require.NoError(t, h.m.HealthCheck())
	require.Equal(t, 1, p.Streams())

	require.NoError(t, h.m.Stop())
	assert.NoError(t, p.WaitForStreams(waitCtx(t), 0), "Stop disconnects the plugin")
	_, err := os.Stat(h.kubeletSocket())
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.NoError(t, h.m.Stop())
	assert.ErrorIs(t, h.m.HealthCheck(), ErrStopped)
}

// Mirrors TestNewManagerImplStartProbeMode: the same through the plugin
// watcher path. The plugin learns that its registration succeeded;
// DeRegisterPlugin disconnects it.
func TestStartProbeModeServesPluginAndStopIsIdempotent(t *testing.T) {
	h := newHarness(t).start()
	p := h.probed(res1, devices("d", 2))
	st, err := p.WaitForRegistrationStatus(waitCtx(t))
	require.NoError(t, err)
	assert.True(t, st.GetPluginRegistered(), st.GetError())
	assert.Len(t, p.CallsOf(plugintest.MethodGetInfo), 1)

	p.StopRegistry()
	h.m.GetWatcherHandler().DeRegisterPlugin(res1, p.SocketPath())
	h.waitCapacity(res1, 2, 0)
	assert.NoError(t, p.WaitForStreams(waitCtx(t), 0))

	require.NoError(t, h.m.Stop())
	assert.NoError(t, h.m.Stop())
	_, err = os.Stat(h.kubeletSocket())
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// reRegistration runs the three-plugin sequence of the upstream
// re-registration tests with register as the registration path.
func reRegistration(t *testing.T, register func(h *harness, p *plugintest.Plugin) error) {
	for _, tc := range []struct{ preStart, preferred bool }{
		{false, false}, {true, false}, {false, true}, {true, true},
	} {
		t.Run(fmt.Sprintf("preStart=%t,preferred=%t", tc.preStart, tc.preferred), func(t *testing.T) {
			h := newHarness(t).start()
			opts := withOptions(tc.preStart, tc.preferred)
			first := []*pluginapi.Device{dev("Dev1", healthy), dev("Dev2", healthy)}
			p1 := h.plugin(res1, first, opts, endpointName("p.sock"))
			require.NoError(t, register(h, p1))
			h.waitCapacity(res1, 2, 2)

			// A second instance on another socket with the same devices: the
			// count stays. Dev2 carries a NUMA node only to tell when the
			// manager has read this instance's list.
			second := []*pluginapi.Device{dev("Dev1", healthy), dev("Dev2", healthy, 0)}
			p2 := h.plugin(res1, second, opts, endpointName("p.new"))
			require.NoError(t, register(h, p2))
			h.waitDeviceTopology(res1, "Dev2", 0)
			c, a := h.capacity(res1)
			assert.Equal(t, int64(2), c)
			assert.Equal(t, int64(2), a)

			// A third with only Dev3: the latest full list wins, nothing of the
			// earlier lists is left over.
			p3 := h.plugin(res1, []*pluginapi.Device{dev("Dev3", healthy)}, opts, endpointName("p.third"))
			require.NoError(t, register(h, p3))
			h.waitCapacity(res1, 1, 1)
			assert.Equal(t, []string{"Dev3"}, sortedKeys(h.m.GetAllocatableDevices()[res1]))
			assert.Equal(t, 1, p1.Streams(), "earlier instances stay connected")
			assert.Equal(t, 1, p2.Streams(), "earlier instances stay connected")

			// The newest instance serves allocations, with its own options.
			pod := newPod("pod", ctr("c", res1, 1))
			h.pods.add(pod)
			require.NoError(t, h.admit(pod))
			assert.Equal(t, []string{"Dev3"}, h.held(pod, "c", res1))
			assert.Len(t, p3.CallsOf(plugintest.MethodAllocate), 1)
			assert.Empty(t, p1.CallsOf(plugintest.MethodAllocate))
			assert.Empty(t, p2.CallsOf(plugintest.MethodAllocate))
			assert.Len(t, p3.CallsOf(plugintest.MethodGetPreferredAllocation), boolCount(tc.preferred))
			_, err := h.m.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
			require.NoError(t, err)
			assert.Len(t, p3.CallsOf(plugintest.MethodPreStartContainer), boolCount(tc.preStart))

			// Any instance's message replaces the list, as in the kubelet.
			p1.Update([]*pluginapi.Device{dev("Dev1", healthy), dev("Dev2", healthy), dev("Dev3", healthy)})
			h.waitCapacity(res1, 3, 3)
		})
	}
}

func boolCount(b bool) int {
	if b {
		return 1
	}
	return 0
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Mirrors TestDevicePluginReRegistration: three instances of one resource
// register on kubelet.sock in turn: 2, 2, then 1 device.
func TestReRegistrationLatestDeviceListWins(t *testing.T) {
	reRegistration(t, func(h *harness, p *plugintest.Plugin) error { return p.Register(h.kubeletSocket()) })
}

// Mirrors TestDevicePluginReRegistrationProbeMode: the same sequence through
// the plugin watcher path.
func TestReRegistrationProbeModeLatestDeviceListWins(t *testing.T) {
	reRegistration(t, func(h *harness, p *plugintest.Plugin) error { return h.probe(p) })
}

// Mirrors TestDevicePluginReRegistration for a plugin that restarts on the
// same socket. The kubelet refuses it ("device plugin
// already connected") while the old connection is registered; devmgr
// replaces the old connection, and the old instance going away later does
// not disturb the new one.
func TestReRegistrationOnSameSocketReplacesConnection(t *testing.T) {
	h := newHarness(t).start()
	old := h.registered(res1, devices("a", 2), endpointName("s.sock"))

	restarted := h.plugin(res1, devices("b", 3), endpointName("s.sock"))
	require.NoError(t, restarted.Register(h.kubeletSocket()))
	h.waitCapacity(res1, 3, 3)
	require.NoError(t, old.WaitForStreams(waitCtx(t), 0), "the old connection is closed")
	old.Stop()

	// The same instance registering again is also just a new connection.
	require.NoError(t, restarted.Register(h.kubeletSocket()))
	assert.Len(t, restarted.CallsOf(plugintest.MethodGetDevicePluginOptions), 2)
	// The replaced connection's follower disconnects it, then ends: once
	// only the new connection's is left, that disconnect has happened.
	h.eventually(func() bool { return followers() == 1 }, "the replaced connection's follower has ended")
	h.eventually(func() bool {
		return len(restarted.CallsOf(plugintest.MethodListAndWatch)) == 2 && restarted.Streams() == 1
	}, "one stream after re-registration")

	pod := newPod("pod", ctr("c", res1, 3))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	assert.Equal(t, []string{"b0", "b1", "b2"}, h.held(pod, "c", res1))
	c, a := h.capacity(res1)
	assert.Equal(t, int64(3), c)
	assert.Equal(t, int64(3), a, "the old instance's disconnect did not mark the devices unhealthy")
}

// followers counts the goroutines, in every manager of the test binary,
// that follow the stream of a plugin instance (ManagerImpl.follow).
func followers() int {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), ".(*ManagerImpl).follow(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// Mirrors TestUpdateCapacityAllocatable: capacity counts every device,
// allocatable the healthy ones; a resource whose plugin is gone stays for
// the grace period and is then removed and reported once; after a restart a
// checkpointed resource is back with 0/0 and still counts as a device-plugin
// resource.
func TestCapacityFollowsHealthDisconnectAndRestart(t *testing.T) {
	h := newHarness(t).start()
	p1 := h.registered(res1, []*pluginapi.Device{dev("D1", healthy), dev("D2", healthy), dev("D3", sick)})
	h.waitCapacity(res1, 3, 2)

	for _, step := range []struct {
		devs              []*pluginapi.Device
		capacity, healthy int64
	}{
		{[]*pluginapi.Device{dev("D1", healthy), dev("D2", healthy)}, 2, 2},
		{[]*pluginapi.Device{dev("D1", healthy), dev("D2", sick), dev("D3", sick)}, 3, 1},
		{[]*pluginapi.Device{dev("D2", sick), dev("D3", sick)}, 2, 0},
	} {
		p1.Update(step.devs)
		h.waitCapacity(res1, step.capacity, step.healthy)
	}

	p2 := h.registered(res2, []*pluginapi.Device{dev("R2D1", healthy), dev("R2D2", sick), dev("R2D3", sick)})
	c, a, removed := h.m.GetCapacity()
	assert.Len(t, c, 2)
	assert.Len(t, a, 2)
	assert.Empty(t, removed)
	assert.Equal(t, quantity(3), c[res2])
	assert.Equal(t, quantity(1), a[res2])

	// res1's plugin goes away; once its grace period is over GetCapacity
	// removes it, reports it once, and leaves res2 alone.
	p1.Stop()
	assert.Equal(t, []string{res1}, h.stepUntilRemoved(res1))
	c, a, removed = h.m.GetCapacity()
	assert.Empty(t, removed, "removed is reported once")
	assert.NotContains(t, c, v1.ResourceName(res1))
	assert.NotContains(t, a, v1.ResourceName(res1))
	assert.Equal(t, quantity(3), c[res2])

	// res2's plugin disconnects: its devices stay in capacity, none allocatable.
	p2.CloseStreams()
	h.waitCapacity(res2, 3, 0)

	h.restart(nil, nil)
	c, a, removed = h.m.GetCapacity()
	assert.Equal(t, v1.ResourceList{res2: quantity(0)}, c)
	assert.Equal(t, v1.ResourceList{res2: quantity(0)}, a)
	assert.Empty(t, removed)

	// res2 is still a device-plugin resource: admission is refused rather
	// than ignored, with the kubelet's text, as not ready (devmgr's
	// distinction); res1 was forgotten and is ignored like any extended
	// resource no plugin serves.
	err := h.admit(newPod("x", ctr("c", res2, 1)))
	require.ErrorIs(t, err, ErrPluginNotReady)
	assert.EqualError(t, err, "no healthy devices present; cannot allocate unhealthy devices "+res2+
		": device plugin not ready (no plugin instance is connected)")
	assert.NoError(t, h.admit(newPod("y", ctr("c", res1, 1))))
}

// Mirrors TestGetAllocatableDevicesMultipleResources.
func TestAllocatableDevicesOfSeveralResources(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, []*pluginapi.Device{dev("R1D1", healthy), dev("R1D2", healthy), dev("R1D3", sick)})
	h.registered(res2, []*pluginapi.Device{dev("R2D1", healthy)})

	got := h.m.GetAllocatableDevices()
	require.Len(t, got, 2)
	assert.Equal(t, []string{"R1D1", "R1D2"}, sortedKeys(got[res1]))
	assert.Equal(t, []string{"R2D1"}, sortedKeys(got[res2]))
	for res, devs := range got {
		for id, d := range devs {
			assert.Equal(t, id, d.GetID(), res)
			assert.Equal(t, healthy, d.GetHealth(), res)
		}
	}
}

// Mirrors TestGetAllocatableDevicesHealthTransition.
func TestAllocatableDevicesFollowHealth(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, []*pluginapi.Device{dev("R1D1", healthy), dev("R1D2", healthy), dev("R1D3", sick)})
	assert.Equal(t, []string{"R1D1", "R1D2"}, sortedKeys(h.m.GetAllocatableDevices()[res1]))

	p.Update([]*pluginapi.Device{dev("R1D1", healthy), dev("R1D2", healthy), dev("R1D3", healthy)})
	h.eventually(func() bool { return len(h.m.GetAllocatableDevices()[res1]) == 3 }, "R1D3 allocatable")
	assert.Equal(t, []string{"R1D1", "R1D2", "R1D3"}, sortedKeys(h.m.GetAllocatableDevices()[res1]))
}

// readCheckpointFile reads the checkpoint file in dir.
func readCheckpointFile(t *testing.T, dir string) ([]checkpoint.PodDevicesEntry, map[string][]string) {
	t.Helper()
	store, err := checkpoint.NewManager(dir)
	require.NoError(t, err)
	data := checkpoint.New(nil, nil)
	require.NoError(t, store.GetCheckpoint(checkpoint.DeviceManagerKey, data))
	return data.GetData()
}

// Mirrors TestCheckpoint: allocations of several pods, containers and
// resources (CDI devices, envs, devices without topology) survive a restart:
// same devices per container, same run options, same node-wide allocated
// counts, and the devices stay taken once the plugins are back. Upstream
// compares internal maps; here the state is observed through the getters.
func TestCheckpointRestoresAllocationsAfterRestart(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.NUMANodes = []int{0, 1} }).start()
	res1Devs := []*pluginapi.Device{dev("dev1", healthy, 0), dev("dev2", healthy, 1), dev("dev3", healthy, 0), dev("dev4", healthy, 1)}
	cdi := func(o *plugintest.Options) { o.CDIDeviceName = func(id string) string { return "vendor.com/r1=" + id } }
	h.registered(res1, res1Devs, cdi)
	h.registered(res2, devices("dev", 2))
	h.registered(res3, []*pluginapi.Device{dev("dev5", healthy)})

	pod1 := newPod("pod1", ctr("con1", res1, 2, res2, 2), ctr("con2", res1, 1))
	pod2 := newPod("pod2", ctr("con1", res1, 1))
	pod3 := newPod("pod3", ctr("con3", res3, 1))
	pods := []*v1.Pod{pod1, pod2, pod3}
	h.pods.add(pods...)
	for _, p := range pods {
		require.NoError(t, h.admit(p))
	}
	require.Equal(t, []string{"dev1", "dev2"}, h.held(pod1, "con1", res1))
	require.Equal(t, []string{"dev3"}, h.held(pod1, "con2", res1))
	require.Equal(t, []string{"dev4"}, h.held(pod2, "con1", res1))

	type state struct {
		devices ResourceDeviceInstances
		opts    *DeviceRunContainerOptions
	}
	observe := func() map[string]state {
		out := map[string]state{}
		for _, p := range pods {
			for i := range p.Spec.Containers {
				c := &p.Spec.Containers[i]
				opts, err := h.m.GetDeviceRunContainerOptions(context.Background(), p, c)
				require.NoError(t, err)
				out[string(p.UID)+"/"+c.Name] = state{h.m.GetDevices(string(p.UID), c.Name), opts}
			}
		}
		return out
	}
	before := observe()
	require.Len(t, before["pod1/con1"].opts.CDIDevices, 2)
	require.Len(t, before["pod1/con1"].opts.Envs, 2)
	require.Nil(t, before["pod3/con3"].devices[res3]["dev5"].GetTopology())
	counts := h.m.UpdatePluginResources(v1.ResourceList{}, pod1)
	require.Equal(t, v1.ResourceList{res1: quantity(4), res2: quantity(2), res3: quantity(1)}, counts)

	h.restart(nil, nil)
	assert.Equal(t, before, observe())
	assert.Equal(t, counts, h.m.UpdatePluginResources(v1.ResourceList{}, pod1))
	c, a, _ := h.m.GetCapacity()
	zero := v1.ResourceList{res1: quantity(0), res2: quantity(0), res3: quantity(0)}
	assert.Equal(t, zero, c, "restored resources have no devices until their plugins report")
	assert.Equal(t, zero, a)

	// The file: entries in admission order (the same history writes the
	// same bytes); devices without topology under -1.
	entries, _ := readCheckpointFile(t, h.dir)
	var keys []string
	for _, e := range entries {
		keys = append(keys, e.PodUID+"/"+e.ContainerName+"/"+e.ResourceName)
	}
	assert.Equal(t, []string{
		"pod1/con1/" + res1, "pod1/con1/" + res2, "pod1/con2/" + res1, "pod2/con1/" + res1, "pod3/con3/" + res3,
	}, keys)
	require.Len(t, entries, 5)
	assert.Equal(t, checkpoint.DevicesPerNUMA{0: {"dev1"}, 1: {"dev2"}}, entries[0].DeviceIDs)
	assert.Equal(t, checkpoint.DevicesPerNUMA{-1: {"dev5"}}, entries[4].DeviceIDs)

	// The plugins come back (new instances): the restored allocations still
	// hold every device.
	h.registered(res1, res1Devs, cdi)
	h.registered(res2, devices("dev", 2))
	h.registered(res3, []*pluginapi.Device{dev("dev5", healthy)})
	for _, res := range []string{res1, res2, res3} {
		err := h.admit(newPod("late-"+res, ctr("c", res, 1)))
		require.ErrorIs(t, err, ErrInsufficientDevices, res)
		assert.EqualError(t, err, "requested number of devices unavailable for "+res+". Requested: 1, Available: 0")
	}
}

// Mirrors the checkpoint-writing side of TestCheckpoint. Unlike the
// kubelet, a ListAndWatch message that leaves the healthy set as it was writes
// nothing (the kubelet rewrites the file on every message). A write replaces
// the file (temporary file renamed over it), so an unchanged file identity
// means no write. Garbage collection, disconnect and Stop never write, as in
// the kubelet; an admission and a health change do.
func TestCheckpointWrittenOnlyWhenContentChanges(t *testing.T) {
	h := newHarness(t).start()
	list := []*pluginapi.Device{dev("d0", healthy), dev("d1", healthy), dev("d2", healthy)}
	p := h.registered(res1, list)
	path := filepath.Join(h.dir, checkpoint.DeviceManagerKey)
	h.eventually(func() bool {
		if _, err := os.Stat(path); err != nil {
			return false
		}
		_, registered := readCheckpointFile(t, h.dir)
		return slices.Equal(registered[res1], []string{"d0", "d1", "d2"})
	}, "checkpoint written after the first device list")
	file := func() os.FileInfo {
		fi, err := os.Stat(path)
		require.NoError(t, err)
		return fi
	}
	first := file()

	for range 3 {
		p.Update(list)
	}
	p.Update([]*pluginapi.Device{dev("d0", healthy), dev("d1", healthy), dev("d2", healthy, 0)})
	h.waitDeviceTopology(res1, "d2", 0)
	assert.True(t, os.SameFile(first, file()), "unchanged healthy set: no write")

	p.Update([]*pluginapi.Device{dev("d0", healthy), dev("d1", sick), dev("d2", healthy)})
	h.eventually(func() bool { return !os.SameFile(first, file()) }, "health change written")
	_, registered := readCheckpointFile(t, h.dir)
	assert.Equal(t, []string{"d0", "d2"}, registered[res1])

	pod := newPod("pod", ctr("c", res1, 1))
	h.pods.add(pod)
	afterHealth := file()
	require.NoError(t, h.admit(pod))
	admitted := file()
	assert.False(t, os.SameFile(afterHealth, admitted), "written before Allocate returns")

	h.pods.remove(pod.UID)
	h.m.UpdateAllocatedDevices()
	require.Nil(t, h.m.GetDevices("pod", "c"))
	p.CloseStreams()
	h.waitCapacity(res1, 3, 0)
	require.NoError(t, h.m.Stop())
	assert.True(t, os.SameFile(admitted, file()), "no write on GC, disconnect or Stop")
	entries, _ := readCheckpointFile(t, h.dir)
	assert.Len(t, entries, 1, "the collected pod stays in the file until the next write")
}

// Mirrors TestResetExtendedResource: the capacity must be reset when the
// checkpoint directory is empty, and only then.
func TestShouldResetExtendedResourceCapacity(t *testing.T) {
	t.Run("own checkpoint directory", func(t *testing.T) {
		ckDir := t.TempDir()
		h := newHarness(t, func(o *Options) { o.CheckpointDir = ckDir }).start()
		assert.True(t, h.m.ShouldResetExtendedResourceCapacity(), "nothing checkpointed yet")

		h.registered(res1, devices("d", 1))
		h.eventually(func() bool { return !h.m.ShouldResetExtendedResourceCapacity() }, "checkpoint written")

		store, err := checkpoint.NewManager(ckDir)
		require.NoError(t, err)
		keys, err := store.ListCheckpoints()
		require.NoError(t, err)
		require.NotEmpty(t, keys)
		for _, k := range keys {
			require.NoError(t, store.RemoveCheckpoint(k))
		}
		assert.True(t, h.m.ShouldResetExtendedResourceCapacity())
	})
	t.Run("shared with the sockets", func(t *testing.T) {
		h := newHarness(t)
		assert.True(t, h.m.ShouldResetExtendedResourceCapacity(), "empty directory")
		h.start()
		assert.False(t, h.m.ShouldResetExtendedResourceCapacity(), "kubelet.sock counts, as with the kubelet")
	})
}

// Mirrors TestUpdateAllocatedResourcesStatus: a container's status gets one
// entry per resource with the health of each of its devices; entries are
// upserted by resource name. A device missing from the plugin's list
// is reported Healthy, as the kubelet does.
func TestAllocatedResourcesStatusReportsDeviceHealth(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, []*pluginapi.Device{dev("dev1", healthy), dev("dev2", healthy), dev("dev3", healthy)})
	pod := newPod("pod", ctr("c", res1, 2), ctr("idle"))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	require.Equal(t, []string{"dev1", "dev2"}, h.held(pod, "c", res1))

	p.Update([]*pluginapi.Device{dev("dev1", healthy), dev("dev2", sick), dev("dev3", healthy)})
	h.waitCapacity(res1, 3, 2)
	status := &v1.PodStatus{
		ContainerStatuses:     []v1.ContainerStatus{{Name: "c"}, {Name: "idle"}},
		InitContainerStatuses: []v1.ContainerStatus{{Name: "c"}},
	}
	h.m.UpdateAllocatedResourcesStatus(pod, status)
	got := status.ContainerStatuses[0].AllocatedResourcesStatus
	require.Len(t, got, 1)
	assert.Equal(t, v1.ResourceName(res1), got[0].Name)
	assert.ElementsMatch(t, []v1.ResourceHealth{
		{ResourceID: "dev1", Health: v1.ResourceHealthStatusHealthy},
		{ResourceID: "dev2", Health: v1.ResourceHealthStatusUnhealthy},
	}, got[0].Resources)
	assert.Nil(t, status.ContainerStatuses[1].AllocatedResourcesStatus, "no devices, no entry")
	assert.Nil(t, status.InitContainerStatuses[0].AllocatedResourcesStatus, "init container statuses are left alone")

	p.Update([]*pluginapi.Device{dev("dev1", healthy), dev("dev3", healthy)})
	h.waitCapacity(res1, 2, 2)
	other := v1.ResourceStatus{Name: "other.com/thing"}
	status.ContainerStatuses[0].AllocatedResourcesStatus = append(status.ContainerStatuses[0].AllocatedResourcesStatus, other)
	h.m.UpdateAllocatedResourcesStatus(pod, status)
	got = status.ContainerStatuses[0].AllocatedResourcesStatus
	require.Len(t, got, 2, "same-name entry replaced, others kept")
	assert.Equal(t, other, got[1])
	assert.ElementsMatch(t, []v1.ResourceHealth{
		{ResourceID: "dev1", Health: v1.ResourceHealthStatusHealthy},
		{ResourceID: "dev2", Health: v1.ResourceHealthStatusHealthy},
	}, got[0].Resources)
}

// Mirrors TestFeatureGateResourceHealthStatus. Repeating a list whose devices
// keep their health notifies nobody; 200 messages that each turn one more
// pod's device unhealthy notify each owner once. The kubelet's channel holds
// 100 updates and drops the rest; devmgr never loses a pod UID. Nobody reads while the 200 messages are handled one by one, so
// the 100-update buffer fills; all 200 UIDs must still arrive, each once, in
// at most 100 (buffer) + 1 (blocked send) + 1 (the merged rest) updates.
func TestHealthUpdatesDeliverEveryPodUIDMerged(t *testing.T) {
	const n = 200
	list := func(sickBelow int, fence string) []*pluginapi.Device {
		devs := make([]*pluginapi.Device, 0, n+1)
		for i := range n {
			health := healthy
			if i < sickBelow {
				health = sick
			}
			devs = append(devs, dev(fmt.Sprintf("dev%d", i), health))
		}
		return append(devs, dev("fence", fence))
	}
	h := newHarness(t).start()
	p := h.registered(res1, list(0, healthy))
	owner := map[string]string{}
	for i := range n + 1 {
		pod := newPod(fmt.Sprintf("pod%d", i), ctr("c", res1, 1))
		h.pods.add(pod)
		require.NoError(t, h.admit(pod))
		held := h.held(pod, "c", res1)
		require.Len(t, held, 1)
		owner[held[0]] = string(pod.UID)
	}
	require.Equal(t, "pod200", owner["fence"])

	for range n {
		p.Update(list(0, healthy))
	}
	// The fence changes one device: had a steady message notified anybody,
	// that UID would come before or with it (updates keep their order).
	p.Update(list(0, sick))
	assert.Equal(t, []string{"pod200"}, h.nextUpdate().PodUIDs)

	for i := range n {
		p.Update(list(i+1, sick))
		h.waitCapacity(res1, n+1, int64(n-i-1))
	}
	seen := map[string]int{}
	updates := 0
	for len(seen) < n {
		u := h.nextUpdate()
		updates++
		for _, uid := range u.PodUIDs {
			seen[uid]++
		}
	}
	for i := range n {
		uid := owner[fmt.Sprintf("dev%d", i)]
		assert.Equal(t, 1, seen[uid], uid)
	}
	assert.Len(t, seen, n, "nobody else was notified")
	assert.LessOrEqual(t, updates, updatesBuffer+2, "pending UIDs were merged")
}

// Mirrors TestDeviceHealthUpdateWithDuplicateDeviceIDs: two resources expose
// the same device ID; a health change notifies only the owner through that
// resource.
func TestHealthUpdatesScopedByResource(t *testing.T) {
	h := newHarness(t).start()
	p1 := h.registered(res1, []*pluginapi.Device{dev("testdevice", healthy)})
	p2 := h.registered(res2, []*pluginapi.Device{dev("testdevice", healthy)})
	pod1 := newPod("pod1", ctr("c", res1, 1))
	pod2 := newPod("pod2", ctr("c", res2, 1))
	h.pods.add(pod1, pod2)
	require.NoError(t, h.admit(pod1))
	require.NoError(t, h.admit(pod2))

	p2.Update([]*pluginapi.Device{dev("testdevice", sick)})
	assert.Equal(t, []string{"pod2"}, h.nextUpdate().PodUIDs)
	p1.Update([]*pluginapi.Device{dev("testdevice", sick)})
	assert.Equal(t, []string{"pod1"}, h.nextUpdate().PodUIDs)
	// Nothing else was queued before this one.
	p2.Update([]*pluginapi.Device{dev("testdevice", healthy)})
	assert.Equal(t, []string{"pod2"}, h.nextUpdate().PodUIDs)
}

// Mirrors TestEndpointSyncOnDisconnect: when the only instance disconnects,
// every device becomes unhealthy (capacity kept, nothing allocatable); after
// the grace period (strictly more than 5 minutes) GetCapacity removes the
// resource once. Upstream sets the stop time by hand; here the plugin ends
// its stream and the fake clock moves. The manager does not dial the plugin
// again; the plugin may register again at any time.
func TestDisconnectKeepsResourceForGracePeriod(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, []*pluginapi.Device{dev("D1", healthy), dev("D2", healthy), dev("D3", sick)})

	p.CloseStreams()
	h.waitCapacity(res1, 3, 0)
	devs, ok := h.m.GetAllocatableDevices()[res1]
	assert.True(t, ok, "devices are still known")
	assert.Empty(t, devs)

	h.clock.Step(DefaultStopGracePeriod)
	c, _, removed := h.m.GetCapacity()
	assert.Empty(t, removed, "exactly the grace period is not yet expired")
	assert.Equal(t, quantity(3), c[res1])

	h.clock.Step(time.Nanosecond)
	c, a, removed := h.m.GetCapacity()
	assert.Equal(t, []string{res1}, removed)
	assert.NotContains(t, c, v1.ResourceName(res1))
	assert.NotContains(t, a, v1.ResourceName(res1))
	c, _, removed = h.m.GetCapacity()
	assert.Empty(t, removed)
	assert.Empty(t, c)
	assert.NotContains(t, h.m.GetAllocatableDevices(), res1)
	pod := newPod("pod", ctr("c", res1, 1))
	assert.Empty(t, h.m.GetTopologyHints(pod, &pod.Spec.Containers[0]), "no longer a device-plugin resource")

	assert.Len(t, p.CallsOf(plugintest.MethodListAndWatch), 1, "not dialled again")
	h.register(p) // waits for 3 devices, 2 of them healthy
}
