package kubeletcompat_test

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	kubeletdm "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager/bitmask"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	schedulerframework "k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/kubeletcompat"
	"github.com/openkubelet/devmgr/plugintest"
)

func TestAllocateOnlyForAnAddOperation(t *testing.T) {
	dir := shortDir(t)
	m, active := adapterOn(t, dir, nil, nil)
	p := startPlugin(t, dir, numaDevices([]int{0}, 2))
	waitAllocatable(t, m, 2)
	ctx := context.Background()

	resized := newPod("resized", nil, container("app", 1))
	active.add(resized)
	require.NoError(t, m.Allocate(ctx, resized, &resized.Spec.Containers[0], lifecycle.ResizeOperation))
	assert.Empty(t, m.GetDevices("resized", "app"), "a resize allocates nothing")
	assert.Empty(t, p.CallsOf(plugintest.MethodAllocate))

	added := newPod("added", nil, container("app", 1))
	active.add(added)
	require.NoError(t, m.Allocate(ctx, added, &added.Spec.Containers[0], lifecycle.AddOperation))
	assert.Len(t, ids(m, added, "app"), 1)
}

func TestAllocatePodAllocatesNothing(t *testing.T) {
	dir := shortDir(t)
	m, active := adapterOn(t, dir, nil, nil)
	startPlugin(t, dir, numaDevices([]int{0}, 2))
	waitAllocatable(t, m, 2)

	pod := newPod("p", nil, container("app", 2))
	active.add(pod)
	require.NoError(t, m.AllocatePod(logger, pod, lifecycle.AddOperation))
	assert.Empty(t, m.GetDevices("p", "app"))
}

func TestRunContainerOptionsInKubeletTypes(t *testing.T) {
	dir := shortDir(t)
	m, active := adapterOn(t, dir, nil, nil)
	p := startPlugin(t, dir, numaDevices([]int{0}, 1))
	waitAllocatable(t, m, 1)
	p.SetAllocateFunc(func(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		return &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{{
			Envs:        map[string]string{"GPU": "0"},
			Mounts:      []*pluginapi.Mount{{ContainerPath: "/run/gpu", HostPath: "/host/run/gpu", ReadOnly: true}},
			Devices:     []*pluginapi.DeviceSpec{{ContainerPath: "/dev/gpu0", HostPath: "/dev/nvidia0", Permissions: "rw"}},
			Annotations: map[string]string{"gpu/id": "gpu-0-0"},
			CdiDevices:  []*pluginapi.CDIDevice{{Name: "example.com/gpu=0"}},
		}}}, nil
	})
	pod := newPod("p", nil, container("app", 1), container("plain", 0))
	active.add(pod)
	ctx := context.Background()
	require.NoError(t, admitAll(ctx, m, pod))

	opts, err := m.GetDeviceRunContainerOptions(ctx, pod, &pod.Spec.Containers[0])
	require.NoError(t, err)
	assert.Equal(t, &kubeletdm.DeviceRunContainerOptions{
		Envs:        []kubecontainer.EnvVar{{Name: "GPU", Value: "0"}},
		Mounts:      []kubecontainer.Mount{{Name: "/run/gpu", ContainerPath: "/run/gpu", HostPath: "/host/run/gpu", ReadOnly: true}},
		Devices:     []kubecontainer.DeviceInfo{{PathOnHost: "/dev/nvidia0", PathInContainer: "/dev/gpu0", Permissions: "rw"}},
		Annotations: []kubecontainer.Annotation{{Name: "gpu/id", Value: "gpu-0-0"}},
		CDIDevices:  []kubecontainer.CDIDevice{{Name: "example.com/gpu=0"}},
	}, opts)

	opts, err = m.GetDeviceRunContainerOptions(ctx, pod, &pod.Spec.Containers[1])
	require.NoError(t, err)
	assert.Nil(t, opts, "a container without devices has no options, as with the kubelet")
}

func TestCapacityAndDevicesInKubeletTypes(t *testing.T) {
	dir := shortDir(t)
	m, active := adapterOn(t, dir, nil, nil)
	devs := numaDevices([]int{0}, 3)
	devs[2].Health = pluginapi.Unhealthy
	startPlugin(t, dir, devs)
	waitAllocatable(t, m, 2)

	capacity, _, removed := m.GetCapacity(logger)
	assert.Equal(t, int64(3), capacity.Name(gpu, resource.DecimalSI).Value())
	assert.Empty(t, removed)

	allocatable := m.GetAllocatableDevices(logger)
	require.Contains(t, allocatable, gpu)
	assert.ElementsMatch(t, []string{"gpu-0-0", "gpu-0-1"}, keys(allocatable[gpu]))

	pod := newPod("p", nil, container("app", 2))
	active.add(pod)
	require.NoError(t, admitAll(context.Background(), m, pod))
	got := m.GetDevices("p", "app")
	require.Contains(t, got, gpu)
	assert.ElementsMatch(t, []string{"gpu-0-0", "gpu-0-1"}, keys(got[gpu]))
	assert.Equal(t, &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 0}}}, got[gpu]["gpu-0-0"].Topology,
		"each device with its NUMA node, as the kubelet gives it")
}

func keys(d kubeletdm.DeviceInstances) []string {
	var out []string
	for id := range d {
		out = append(out, id)
	}
	return out
}

func mask(t *testing.T, nodes ...int) bitmask.BitMask {
	t.Helper()
	b, err := bitmask.NewBitMask(nodes...)
	require.NoError(t, err)
	return b
}

func TestHintsInKubeletTypes(t *testing.T) {
	dir := shortDir(t)
	m, active := adapterOn(t, dir, []int{0, 1}, nil)
	startPlugin(t, dir, numaDevices([]int{0, 1}, 2))
	waitAllocatable(t, m, 4)

	one := newPod("one", nil, container("app", 1), container("plain", 0))
	active.add(one)
	assert.Equal(t, map[string][]topologymanager.TopologyHint{gpu: {
		{NUMANodeAffinity: mask(t, 0), Preferred: true},
		{NUMANodeAffinity: mask(t, 1), Preferred: true},
		{NUMANodeAffinity: mask(t, 0, 1), Preferred: false},
	}}, m.GetTopologyHints(logger, one, &one.Spec.Containers[0], lifecycle.AddOperation))
	assert.Empty(t, m.GetTopologyHints(logger, one, &one.Spec.Containers[1], lifecycle.AddOperation))

	three := newPod("three", nil, container("a", 2), container("b", 1))
	active.add(three)
	assert.Equal(t, map[string][]topologymanager.TopologyHint{gpu: {
		{NUMANodeAffinity: mask(t, 0, 1), Preferred: true},
	}}, m.GetPodTopologyHints(logger, three, lifecycle.AddOperation))

	five := newPod("five", nil, container("app", 5))
	hints := m.GetTopologyHints(logger, five, &five.Spec.Containers[0], lifecycle.AddOperation)
	require.Contains(t, hints, gpu)
	assert.NotNil(t, hints[gpu], "no placement fits: an empty list, not nil (no preference)")
	assert.Empty(t, hints[gpu])
}

func TestHintsWithoutTopologyAreNoPreference(t *testing.T) {
	dir := shortDir(t)
	m, _ := adapterOn(t, dir, nil, nil)
	startPlugin(t, dir, numaDevices([]int{0}, 1))
	waitAllocatable(t, m, 1)

	pod := newPod("p", nil, container("app", 1))
	hints := m.GetTopologyHints(logger, pod, &pod.Spec.Containers[0], lifecycle.AddOperation)
	require.Contains(t, hints, gpu)
	assert.Nil(t, hints[gpu])
}

func TestUpdatePluginResourcesRaisesAllocatableForAPodWithDevices(t *testing.T) {
	dir := shortDir(t)
	m, active := adapterOn(t, dir, nil, nil)
	p := startPlugin(t, dir, numaDevices([]int{0}, 2))
	waitAllocatable(t, m, 2)
	pod := newPod("p", nil, container("app", 2))
	active.add(pod)
	require.NoError(t, admitAll(context.Background(), m, pod))
	p.Stop()
	waitAllocatable(t, m, 0)

	before := &schedulerframework.Resource{MilliCPU: 4000, ScalarResources: map[v1.ResourceName]int64{gpu: 0, "example.com/nic": 3}}
	node := &schedulerframework.NodeInfo{Allocatable: before}
	require.NoError(t, m.UpdatePluginResources(node, &lifecycle.PodAdmitAttributes{Pod: pod}))
	assert.Equal(t, &schedulerframework.Resource{MilliCPU: 4000, ScalarResources: map[v1.ResourceName]int64{gpu: 2, "example.com/nic": 3}},
		node.Allocatable)
	assert.Equal(t, int64(0), before.ScalarResources[gpu], "the old Resource is replaced, not modified")

	other := &schedulerframework.NodeInfo{Allocatable: before}
	require.NoError(t, m.UpdatePluginResources(other, &lifecycle.PodAdmitAttributes{Pod: newPod("q", nil, container("app", 1))}))
	assert.Same(t, before, other.Allocatable, "a pod without devices leaves the node alone")

	bare := &schedulerframework.NodeInfo{}
	require.NoError(t, m.UpdatePluginResources(bare, &lifecycle.PodAdmitAttributes{Pod: pod}))
	assert.Equal(t, &schedulerframework.Resource{ScalarResources: map[v1.ResourceName]int64{gpu: 2}}, bare.Allocatable,
		"a node without allocatable gets the allocated count")
}

func TestHealthCheckerPassesUnlessRegistrationFails(t *testing.T) {
	dir := shortDir(t)
	m, err := kubeletcompat.New(devicemanager.Options{SocketDir: dir, Logger: testLogger(t)}, nil)
	require.NoError(t, err)
	hc := m.GetHealthChecker()
	assert.Equal(t, "device-plugin", hc.Name())
	req, err := http.NewRequest(http.MethodGet, "/healthz", nil)
	require.NoError(t, err)

	assert.NoError(t, hc.Check(req), "before Start")
	require.NoError(t, m.Start(logger, nil, nil, nil, nil))
	assert.NoError(t, hc.Check(req), "serving")
	require.NoError(t, m.Stop(logger))
	assert.NoError(t, hc.Check(req), "after Stop")
}

// notReady is a config.SourcesReady that has not seen every source yet.
type notReady struct{}

func (notReady) AddSource(string) {}
func (notReady) AllReady() bool   { return false }

func TestContainersRunningAtStartPassWhileSourcesAreNotReady(t *testing.T) {
	dir := shortDir(t)
	m, err := kubeletcompat.New(devicemanager.Options{SocketDir: dir, Logger: testLogger(t)}, nil)
	require.NoError(t, err)
	running := containermap.NewContainerMap()
	running.Add("running", "app", "cid-1")
	running.Add("created", "app", "cid-2")
	active := &pods{}
	require.NoError(t, m.Start(logger, active.get, notReady{}, running, sets.New("cid-1")))
	t.Cleanup(func() { require.NoError(t, m.Stop(logger)) })
	startPlugin(t, dir, []*pluginapi.Device{{ID: "gpu-0", Health: pluginapi.Unhealthy}})
	require.Eventually(t, func() bool {
		capacity, _, _ := m.GetCapacity(logger)
		return capacity.Name(gpu, resource.DecimalSI).Value() == 1
	}, waitFor, 5*time.Millisecond)

	ctx := context.Background()
	for _, uid := range []string{"running", "created"} {
		pod := newPod(uid, nil, container("app", 1))
		active.add(pod)
		err := m.Allocate(ctx, pod, &pod.Spec.Containers[0], lifecycle.AddOperation)
		if uid == "running" {
			assert.NoError(t, err, "a container running at Start is not checked again")
		} else {
			assert.ErrorIs(t, err, devicemanager.ErrNoHealthyDevices, "a container only created is")
		}
	}
}

func TestShouldResetOnlyOnAnEmptyDirectory(t *testing.T) {
	dir := shortDir(t)
	m, err := kubeletcompat.New(devicemanager.Options{SocketDir: dir, Logger: testLogger(t)}, nil)
	require.NoError(t, err)
	assert.True(t, m.ShouldResetExtendedResourceCapacity(), "nothing in the directory: a new node")
	require.NoError(t, m.Start(logger, nil, nil, nil, nil))
	t.Cleanup(func() { require.NoError(t, m.Stop(logger)) })
	assert.FileExists(t, filepath.Join(dir, devicemanager.KubeletSocketName))
	assert.False(t, m.ShouldResetExtendedResourceCapacity(), "the directory holds kubelet.sock, as the kubelet's does")
}

func TestWatcherHandlerRegistersAndDeregisters(t *testing.T) {
	dir := shortDir(t)
	m, _ := adapterOn(t, dir, nil, nil)
	p, err := plugintest.New(plugintest.Options{ResourceName: gpu, SocketDir: dir, Devices: numaDevices([]int{0}, 2), Logger: testLogger(t)})
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	require.NoError(t, p.Start())
	ctx := context.Background()

	h := m.GetWatcherHandler()
	assert.Error(t, h.ValidatePlugin(ctx, gpu, p.SocketPath(), []string{"v1alpha"}), "unsupported version")
	assert.Error(t, h.ValidatePlugin(ctx, "gpu", p.SocketPath(), []string{pluginapi.Version}), "not an extended resource name")
	require.NoError(t, h.ValidatePlugin(ctx, gpu, p.SocketPath(), []string{pluginapi.Version}))
	timeout := 5 * time.Second
	require.NoError(t, h.RegisterPlugin(ctx, gpu, p.SocketPath(), []string{pluginapi.Version}, &timeout))
	waitAllocatable(t, m, 2)

	h.DeRegisterPlugin(ctx, gpu, p.SocketPath())
	waitAllocatable(t, m, 0)
}

func TestUpdatesNamePodsAndStayOpenAfterStop(t *testing.T) {
	m, _ := podOnFailedDevice(t)
	select {
	case u := <-m.Updates():
		assert.Equal(t, []string{"p"}, u.PodUIDs)
	case <-time.After(waitFor):
		t.Fatal("no update for the pod whose device failed")
	}

	require.NoError(t, m.Stop(logger))
	select {
	case u, ok := <-m.Updates():
		t.Fatalf("Updates after Stop: %v, open %v; the kubelet's channel is never closed", u, ok)
	default:
	}
}

// adapterWithPods is an adapter and the active pods it reads.
type adapterWithPods struct {
	*kubeletcompat.Manager
	active *pods
}

// podOnFailedDevice admits pod "p" on both devices of a plugin, then the
// plugin reports the second one unhealthy.
func podOnFailedDevice(t *testing.T) (adapterWithPods, *v1.Pod) {
	t.Helper()
	dir := shortDir(t)
	m, active := adapterOn(t, dir, nil, nil)
	devs := numaDevices([]int{0}, 2)
	p := startPlugin(t, dir, devs)
	waitAllocatable(t, m, 2)
	pod := newPod("p", nil, container("app", 2))
	active.add(pod)
	require.NoError(t, admitAll(context.Background(), m, pod))
	devs[1].Health = pluginapi.Unhealthy
	p.Update(devs)
	waitAllocatable(t, m, 1)
	return adapterWithPods{Manager: m, active: active}, pod
}

func TestResourceStatusAndRelease(t *testing.T) {
	m, pod := podOnFailedDevice(t)
	status := &v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: "app"}}}
	m.UpdateAllocatedResourcesStatus(logger, pod, status)
	assert.Equal(t, []v1.ResourceStatus{{Name: gpu, Resources: []v1.ResourceHealth{
		{ResourceID: "gpu-0-0", Health: v1.ResourceHealthStatusHealthy},
		{ResourceID: "gpu-0-1", Health: v1.ResourceHealthStatusUnhealthy},
	}}}, status.ContainerStatuses[0].AllocatedResourcesStatus)

	m.active.remove("p")
	m.UpdateAllocatedDevices(logger)
	assert.Empty(t, m.GetDevices("p", "app"), "the devices of a pod no longer active are released")
}
