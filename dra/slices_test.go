package dra_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/dra"
)

func status(name string, devs ...devicemanager.DeviceStatus) devicemanager.ResourceStatus {
	return devicemanager.ResourceStatus{Name: name, Devices: devs}
}

func healthy(id string, numa ...int64) devicemanager.DeviceStatus {
	return devicemanager.DeviceStatus{ID: id, Health: "Healthy", NUMANodes: numa}
}

func names(p []resourceapi.Device) []string {
	var out []string
	for _, d := range p {
		out = append(out, d.Name)
	}
	return out
}

// Each resource is one pool of its healthy devices that no pod holds.
func TestPoolsHoldTheHealthyFreeDevices(t *testing.T) {
	held := healthy("gpu-1")
	held.Allocated = true
	sick := healthy("gpu-2")
	sick.Health = "Unhealthy"
	claimed := healthy("gpu-4")
	claimed.Allocated, claimed.Claimed = true, true
	got := dra.Resources("node-a", []devicemanager.ResourceStatus{
		status("example.com/gpu", healthy("gpu-3", 1), held, sick, healthy("gpu-0", 0), claimed),
		status("example.com/fpga"),
	})
	require.Len(t, got.Pools, 2)
	gpus := got.Pools["node-a/example.com/gpu"]
	require.Len(t, gpus.Slices, 1)
	assert.Equal(t, []string{"gpu-0", "gpu-3", "gpu-4"}, names(gpus.Slices[0].Devices),
		"in name order; held by a pod and unhealthy left out, held by a claim kept")
	fpgas := got.Pools["node-a/example.com/fpga"]
	require.Len(t, fpgas.Slices, 1, "a resource without devices has an empty pool")
	assert.Empty(t, fpgas.Slices[0].Devices)

	d := gpus.Slices[0].Devices[1]
	assert.Equal(t, ptr.To("example.com/gpu"), d.Attributes[dra.AttributeResourceName].StringValue)
	assert.Equal(t, ptr.To("gpu-3"), d.Attributes[dra.AttributeDeviceID].StringValue)
	assert.Equal(t, ptr.To(int64(1)), d.Attributes[deviceattribute.StandardDeviceAttributeNUMANode].IntValue)
}

func TestNUMANodeOnlyForOneNode(t *testing.T) {
	for _, numa := range [][]int64{nil, {0, 1}, {-1}} {
		d := dra.Device("example.com/gpu", healthy("g", numa...))
		_, ok := d.Attributes[deviceattribute.StandardDeviceAttributeNUMANode]
		assert.False(t, ok, "NUMA nodes %v", numa)
	}
}

// A pool holds at most 128 devices a slice.
func TestLargePoolsAreSplit(t *testing.T) {
	var devs []devicemanager.DeviceStatus
	for i := range 300 {
		devs = append(devs, healthy(strings.Repeat("a", 1+i%5)+"-"+string(rune('a'+i%26))+string(rune('a'+i/26))))
	}
	pool := dra.Resources("n", []devicemanager.ResourceStatus{status("example.com/gpu", devs...)}).Pools["n/example.com/gpu"]
	var sizes []int
	for _, s := range pool.Slices {
		sizes = append(sizes, len(s.Devices))
	}
	assert.Equal(t, []int{128, 128, 44}, sizes)
}

// Device names are DNS labels, the plugin's ID when it is one, and two IDs
// never share one.
func TestDeviceNames(t *testing.T) {
	assert.Equal(t, "gpu-0", dra.DeviceName("gpu-0"))
	ids := []string{"GPU-0", "gpu_0", "gpu.0", "nvidia0/mig-1g.5gb", "", "-", strings.Repeat("X", 200), strings.Repeat("x", 64), "ü"}
	seen := map[string]string{}
	for _, id := range ids {
		name := dra.DeviceName(id)
		assert.Empty(t, validation.IsDNS1123Label(name), "ID %q: name %q", id, name)
		if other, dup := seen[name]; dup {
			t.Errorf("IDs %q and %q share the name %q", id, other, name)
		}
		seen[name] = id
	}
	assert.True(t, strings.HasPrefix(dra.DeviceName("GPU-0"), "gpu-0-"), "readable: %s", dra.DeviceName("GPU-0"))
}

func TestPoolNames(t *testing.T) {
	assert.Equal(t, "node-a/example.com/gpu", dra.PoolName("node-a", "example.com/gpu"))
	for _, res := range []string{"example.com/GPU_mem", "example.com/" + strings.Repeat("a", 300)} {
		name := dra.PoolName("node-a", res)
		require.True(t, strings.HasPrefix(name, "node-a/"), name)
		assert.LessOrEqual(t, len(name), resourceapi.PoolNameMaxLength)
		assert.Empty(t, validation.IsDNS1123Label(strings.TrimPrefix(name, "node-a/")), name)
	}
	assert.NotEqual(t, dra.PoolName("n", "example.com/GPU"), dra.PoolName("n", "example.com/gpu-"))
}

// manager is a Source whose status a test sets.
type manager struct {
	st chan []devicemanager.ResourceStatus
}

func (m *manager) Status() []devicemanager.ResourceStatus {
	st := <-m.st
	m.st <- st
	return st
}

func (m *manager) set(st ...devicemanager.ResourceStatus) { <-m.st; m.st <- st }

// Run publishes the pools, updates them as the devices change, and leaves
// them when it ends.
func TestRunPublishesAndFollows(t *testing.T) {
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "uid-a"}})
	m := &manager{st: make(chan []devicemanager.ResourceStatus, 1)}
	m.st <- []devicemanager.ResourceStatus{status("example.com/gpu", healthy("gpu-0"), healthy("gpu-1"))}
	p, err := dra.NewSlicePublisher(dra.SlicePublisherOptions{Manager: m, Client: client, NodeName: "node-a", PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled, "Run returns its context's error")
	}()

	published := func() []string {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		var out []string
		for _, s := range list.Items {
			assert.Equal(t, dra.DefaultDriverName, s.Spec.Driver)
			assert.Equal(t, ptr.To("node-a"), s.Spec.NodeName)
			for _, d := range s.Spec.Devices {
				out = append(out, s.Spec.Pool.Name+" "+d.Name)
			}
		}
		return out
	}
	assert.Eventually(t, func() bool {
		return assert.ObjectsAreEqual([]string{"node-a/example.com/gpu gpu-0", "node-a/example.com/gpu gpu-1"}, published())
	}, 30*time.Second, 10*time.Millisecond)

	sick := healthy("gpu-1")
	sick.Health = "Unhealthy"
	m.set(status("example.com/gpu", healthy("gpu-0"), sick))
	assert.Eventually(t, func() bool {
		return assert.ObjectsAreEqual([]string{"node-a/example.com/gpu gpu-0"}, published())
	}, 30*time.Second, 10*time.Millisecond)
}

// With DeviceClasses, each resource gets a class that maps its extended
// resource name to its devices; a class that exists is left alone, and a
// resource that appears later gets one too.
func TestRunMakesADeviceClassPerResource(t *testing.T) {
	mine := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "example.com-fpga"}}
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "uid-a"}}, mine)
	m := &manager{st: make(chan []devicemanager.ResourceStatus, 1)}
	m.st <- []devicemanager.ResourceStatus{status("example.com/gpu", healthy("gpu-0")), status("example.com/fpga")}
	p, err := dra.NewSlicePublisher(dra.SlicePublisherOptions{Manager: m, Client: client, NodeName: "node-a",
		PollInterval: 10 * time.Millisecond, DeviceClasses: true})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
	}()
	class := func(name string) *resourceapi.DeviceClass {
		c, err := client.ResourceV1().DeviceClasses().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return c
	}
	require.Eventually(t, func() bool { return class("example.com-gpu") != nil }, 30*time.Second, 10*time.Millisecond)
	gpu := class("example.com-gpu")
	assert.Equal(t, ptr.To("example.com/gpu"), gpu.Spec.ExtendedResourceName)
	assert.Equal(t, `device.driver == "devmgr.openkubelet.io" && device.attributes["devmgr.openkubelet.io"].resourceName == "example.com/gpu"`,
		gpu.Spec.Selectors[0].CEL.Expression)
	assert.Nil(t, class("example.com-fpga").Spec.ExtendedResourceName, "the existing class is left alone")

	m.set(status("example.com/gpu", healthy("gpu-0")), status("example.com/nic"))
	require.Eventually(t, func() bool { return class("example.com-nic") != nil }, 30*time.Second, 10*time.Millisecond)
}

func TestDeviceClassNamesAreValid(t *testing.T) {
	for _, res := range []string{"example.com/gpu", "Example.COM/GPU_x", "a/" + strings.Repeat("b", 300)} {
		name := dra.DeviceClassName(res)
		assert.Empty(t, validation.IsDNS1123Subdomain(name), "%q -> %q", res, name)
	}
	assert.NotEqual(t, dra.DeviceClassName("Example.COM/GPU_x"), dra.DeviceClassName("Example.COM/GPU-x"))
}

func TestOptionsAreChecked(t *testing.T) {
	client := fake.NewClientset()
	for _, o := range []dra.SlicePublisherOptions{
		{Client: client, NodeName: "n"},
		{Manager: &manager{}, NodeName: "n"},
		{Manager: &manager{}, Client: client},
		{Manager: &manager{}, Client: client, NodeName: "n", DriverName: "Not_A_Domain"},
		{Manager: &manager{}, Client: client, NodeName: "n", PollInterval: -1},
		{Manager: &manager{}, Client: client, NodeName: "n", DriverName: "9gpu.example.com"}, // no CDI vendor
	} {
		_, err := dra.NewSlicePublisher(o)
		assert.Error(t, err, "%+v", o)
	}
	for _, o := range []dra.DriverOptions{
		{Client: client, NodeName: "n"},
		{Manager: &devicemanager.ManagerImpl{}, NodeName: "n"},
		{Manager: &devicemanager.ManagerImpl{}, Client: client},
		{Manager: &devicemanager.ManagerImpl{}, Client: client, NodeName: "n", DriverName: "9gpu.example.com"},
	} {
		_, err := dra.StartDriver(context.Background(), o)
		assert.Error(t, err, "%+v", o)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
