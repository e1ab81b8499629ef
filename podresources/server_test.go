package podresources_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podresources"
)

const (
	gpu = "example.com/gpu"
	nic = "example.com/nic"
)

// gpus: one device per NUMA node, one on both, one more on node 1.
func gpus() []*pluginapi.Device {
	return []*pluginapi.Device{device("gpu-0", 0), device("gpu-1", 1), device("gpu-2", 0, 1), device("gpu-3", 1)}
}

// nics report no NUMA node: no topology at all, or a topology that lists none.
func nics() []*pluginapi.Device {
	return []*pluginapi.Device{device("nic-a"), device("nic-b"), {ID: "nic-c", Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{}}}
}

// trainPod has a regular init container and a sidecar with devices, an app
// container that reuses the init container's GPU, and one without devices.
func trainPod() *v1.Pod {
	return pod("ml", "train", "uid-train",
		[]v1.Container{
			container("setup", map[string]int64{gpu: 1}),
			sidecar(container("proxy", map[string]int64{nic: 1})),
		},
		container("main", map[string]int64{gpu: 2}),
		container("aux", nil),
	)
}

func otherPod() *v1.Pod {
	return pod("default", "other", "uid-other", nil, container("c", map[string]int64{gpu: 1, nic: 1}))
}

// loadedNode is a node with both plugins and both pods admitted: setup gets
// gpu-0, proxy nic-a, main gpu-0 (reused) and gpu-1, other/c gpu-2 (on both
// nodes) and nic-b.
func loadedNode(t *testing.T) (*node, *plugintest.Plugin) {
	n := newNode(t)
	g := n.plugin(gpu, gpus())
	n.plugin(nic, nics())
	n.admit(trainPod())
	n.admit(otherPod())
	return n, g
}

var (
	wantTrain = podRes("ml", "train",
		ctr("proxy", dev(nic, "nic-a", -1)),
		ctr("main", dev(gpu, "gpu-0", 0), dev(gpu, "gpu-1", 1)),
		ctr("aux"),
	)
	wantOther = podRes("default", "other",
		ctr("c", dev(gpu, "gpu-2", 0), dev(gpu, "gpu-2", 1), dev(nic, "nic-b", -1)),
	)
)

func TestListAndGetReportContainersAndTheirDevices(t *testing.T) {
	n, g := loadedNode(t)
	_, client := n.serve(podresources.Options{})
	ctx := callCtx(t)

	list, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	require.NoError(t, err)
	assertProto(t, &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{wantTrain, wantOther}},
		list, "List: sidecar before app containers, no regular init container, one entry per device and NUMA node, sorted")

	got, err := client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: "ml", PodName: "train"})
	require.NoError(t, err)
	assertProto(t, &podresourcesv1.GetPodResourcesResponse{PodResources: wantTrain}, got, "Get ml/train")

	t.Run("unknown pod is NotFound", func(t *testing.T) {
		for _, req := range []*podresourcesv1.GetPodResourcesRequest{
			{PodNamespace: "default", PodName: "train"}, // right name, wrong namespace
			{PodNamespace: "ml", PodName: "nope"},
			{},
		} {
			_, err := client.Get(ctx, req)
			assert.Equal(t, codes.NotFound, status.Code(err), req.String())
			assert.Equal(t, fmt.Sprintf("pod %s in namespace %s not found", req.PodName, req.PodNamespace), status.Convert(err).Message())
		}
	})

	t.Run("device allocated then unhealthy stays with its container, leaves allocatable", func(t *testing.T) {
		devs := gpus()
		unhealthy(devs[2]) // gpu-2, held by other/c
		g.Update(devs)
		n.waitAllocatable(gpu, "gpu-0", "gpu-1", "gpu-3")

		got, err := client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: "default", PodName: "other"})
		require.NoError(t, err)
		assertProto(t, &podresourcesv1.GetPodResourcesResponse{PodResources: wantOther}, got, "Get default/other")

		alloc, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
		require.NoError(t, err)
		for _, cd := range alloc.GetDevices() {
			assert.NotEqual(t, "gpu-2", cd.GetDeviceIds()[0], "unhealthy device listed as allocatable")
		}
	})

	t.Run("List collects the allocations of pods that are gone", func(t *testing.T) {
		require.NotNil(t, n.mgr.GetDevices("uid-other", "c"))
		n.pods.set(trainPod())
		list, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
		require.NoError(t, err)
		assertProto(t, &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{wantTrain}}, list, "List after other left")
		assert.Nil(t, n.mgr.GetDevices("uid-other", "c"), "List did not let the manager drop other's devices")
	})

	t.Run("no pods", func(t *testing.T) {
		n.pods.set()
		list, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
		require.NoError(t, err)
		assert.Empty(t, list.GetPodResources())
	})
}

func TestGetAllocatableResourcesReportsEveryHealthyDevice(t *testing.T) {
	n, g := loadedNode(t)
	// A resource whose only device is unhealthy contributes nothing.
	n.plugin("example.com/fpga", []*pluginapi.Device{unhealthy(device("fpga-0", 0))})
	_, client := n.serve(podresources.Options{})
	ctx := callCtx(t)

	all := []*podresourcesv1.ContainerDevices{
		dev(gpu, "gpu-0", 0), dev(gpu, "gpu-1", 1), dev(gpu, "gpu-2", 0), dev(gpu, "gpu-2", 1), dev(gpu, "gpu-3", 1),
		dev(nic, "nic-a", -1), dev(nic, "nic-b", -1), dev(nic, "nic-c", -1),
	}
	alloc, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	require.NoError(t, err)
	assertProto(t, &podresourcesv1.AllocatableResourcesResponse{Devices: all}, alloc,
		"allocated and free healthy devices, one entry per NUMA node, none for the unhealthy FPGA")
	assert.Empty(t, alloc.GetCpuIds(), "devmgr has no CPU manager")
	assert.Empty(t, alloc.GetMemory(), "devmgr has no memory manager")

	devs := gpus()
	unhealthy(devs[0]) // allocated to setup and main
	unhealthy(devs[3]) // free
	g.Update(devs)
	n.waitAllocatable(gpu, "gpu-1", "gpu-2")
	alloc, err = client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	require.NoError(t, err)
	assertProto(t, &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
		dev(gpu, "gpu-1", 1), dev(gpu, "gpu-2", 0), dev(gpu, "gpu-2", 1),
		dev(nic, "nic-a", -1), dev(nic, "nic-b", -1), dev(nic, "nic-c", -1),
	}}, alloc, "after gpu-0 and gpu-3 turned unhealthy")

	g.Update(gpus())
	n.waitAllocatable(gpu, "gpu-0", "gpu-1", "gpu-2", "gpu-3")
	alloc, err = client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	require.NoError(t, err)
	assertProto(t, &podresourcesv1.AllocatableResourcesResponse{Devices: all}, alloc, "after both recovered")

	t.Run("concurrent calls while health changes", func(t *testing.T) {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 20 {
					_, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
					assert.NoError(t, err)
					_, err = client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
					assert.NoError(t, err)
				}
			})
		}
		for i := range 10 {
			devs := gpus()
			unhealthy(devs[i%len(devs)])
			g.Update(devs)
		}
		wg.Wait()
	})
}

// fakeDevices is a DeviceSource with fixed answers, for device shapes a
// real plugin and manager cannot produce.
type fakeDevices struct {
	alloc devicemanager.ResourceDeviceInstances
	byCtr map[string]devicemanager.ResourceDeviceInstances
}

func (f fakeDevices) GetDevices(podUID, name string) devicemanager.ResourceDeviceInstances {
	return f.byCtr[podUID+"/"+name]
}

func (f fakeDevices) GetAllocatableDevices() devicemanager.ResourceDeviceInstances { return f.alloc }

func TestDeviceShapesAndContainerKinds(t *testing.T) {
	topo := func(nodes ...*pluginapi.NUMANode) *pluginapi.Device {
		return &pluginapi.Device{Topology: &pluginapi.TopologyInfo{Nodes: nodes}}
	}
	src := fakeDevices{
		alloc: devicemanager.ResourceDeviceInstances{
			"b.com/x": {
				"d2":   topo(&pluginapi.NUMANode{ID: 3}, &pluginapi.NUMANode{ID: 1}, &pluginapi.NUMANode{ID: 3}), // repeated node
				"d1":   topo(nil, &pluginapi.NUMANode{ID: 0}),                                                    // a nil node
				"d0":   topo(nil),                                                                                // only a nil node
				"d10":  nil,                                                                                      // no device at all
				"d1-0": {},
			},
			"a.com/y": {"z": topo()},
			"c.com/z": {}, // a resource with no healthy device
		},
		byCtr: map[string]devicemanager.ResourceDeviceInstances{
			"u1/side": {"a.com/y": {"y0": topo(&pluginapi.NUMANode{ID: 2})}},
		},
	}
	onFailure := v1.ContainerRestartPolicy("OnFailure")
	p := pod("ns", "p", "u1", []v1.Container{
		{Name: "init"},
		{Name: "odd", RestartPolicy: &onFailure}, // not a sidecar
		sidecar(v1.Container{Name: "side"}),
	}, v1.Container{Name: "app"})
	srv, err := podresources.NewServer(src, podresources.PodsFunc(func() []*v1.Pod { return []*v1.Pod{nil, p} }), podresources.Options{})
	require.NoError(t, err)
	ctx := callCtx(t)

	alloc, err := srv.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	require.NoError(t, err)
	assertProto(t, &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
		dev("a.com/y", "z", -1),
		dev("b.com/x", "d0", -1),
		dev("b.com/x", "d1", 0),
		dev("b.com/x", "d1-0", -1),
		dev("b.com/x", "d10", -1),
		dev("b.com/x", "d2", 1),
		dev("b.com/x", "d2", 3),
	}}, alloc, "sorted; nil nodes skipped; repeated nodes once; no node means no topology")

	list, err := srv.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	require.NoError(t, err)
	assertProto(t, &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		podRes("ns", "p", ctr("side", dev("a.com/y", "y0", 2)), ctr("app")),
	}}, list, "nil pod skipped; only restartable init containers")
}

func TestMessageSizeLimits(t *testing.T) {
	n := newNode(t)
	n.plugin(gpu, gpus())
	for i := range 40 {
		n.admit(pod("default", fmt.Sprintf("pod-with-a-long-enough-name-%02d", i), types.UID(fmt.Sprint("uid-", i)), nil, container("c", nil)))
	}
	_, client := n.serve(podresources.Options{MaxSendMsgSize: 1024, MaxRecvMsgSize: 512})
	ctx := callCtx(t)

	_, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "a response above the send limit: %v", err)

	_, err = client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: "default", PodName: string(make([]byte, 600))})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "a request above the receive limit: %v", err)

	// The server and the connection keep working.
	alloc, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	require.NoError(t, err)
	assert.Len(t, alloc.GetDevices(), 5)
	got, err := client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: "default", PodName: "pod-with-a-long-enough-name-07"})
	require.NoError(t, err)
	assert.Equal(t, "pod-with-a-long-enough-name-07", got.GetPodResources().GetName())
}
