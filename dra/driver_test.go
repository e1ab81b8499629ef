package dra_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/dra"
	"github.com/openkubelet/devmgr/plugintest"
)

const (
	node   = "node-a"
	gpuRes = "example.com/gpu"
)

// driverNode is a manager with a plugin of three GPUs and the driver, in one
// temporary directory, with the claims a fake API server holds.
type driverNode struct {
	t      *testing.T
	dir    string
	client *fake.Clientset
	plugin *plugintest.Plugin // the current manager's
	// plugins are every plugin started, the current one last.
	plugins []*plugintest.Plugin
	mgr     *devicemanager.ManagerImpl
	driver  *dra.Driver
	conn    *grpc.ClientConn
	// stopFunc stops what start started, once.
	stopFunc func()
	clock    *testingclock.FakeClock // the driver's
}

func newDriverNode(t *testing.T, claims ...*resourceapi.ResourceClaim) *driverNode {
	dir, err := os.MkdirTemp("", "dra")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := &driverNode{t: t, dir: dir, client: fake.NewClientset(), clock: testingclock.NewFakeClock(time.Now())}
	for _, c := range claims {
		_, err := n.client.ResourceV1().ResourceClaims(c.Namespace).Create(context.Background(), c, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	n.start()
	return n
}

// start starts a manager and a driver on the node's directories and
// registers the plugin with the manager.
func (n *driverNode) start() { n.startWith(true) }

// startWith is start; without register the plugin serves but has not
// registered yet (n.registerPlugin does it).
func (n *driverNode) startWith(register bool) {
	t := n.t
	var err error
	n.mgr, err = devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: n.dir, Logger: ktesting.NewLogger(t, ktesting.NewConfig())})
	require.NoError(t, err)
	require.NoError(t, n.mgr.Start(func() []*v1.Pod { return nil }, nil, nil, nil))
	t.Cleanup(func() { _ = n.mgr.Stop() }) // when start fails; Stop twice is fine
	// Start clears the socket directory: each manager gets a plugin of its
	// own, with the same devices.
	n.plugin, err = plugintest.New(plugintest.Options{
		ResourceName: gpuRes, SocketDir: n.dir,
		Devices: []*pluginapi.Device{
			{ID: "gpu-0", Health: pluginapi.Healthy}, {ID: "gpu-1", Health: pluginapi.Healthy}, {ID: "gpu-2", Health: pluginapi.Healthy},
		},
	})
	require.NoError(t, err)
	require.NoError(t, n.plugin.Start())
	t.Cleanup(n.plugin.Stop)
	n.plugins = append(n.plugins, n.plugin)
	if register {
		n.registerPlugin()
	}

	ctx, cancel := context.WithCancel(context.Background())
	n.driver, err = dra.StartDriver(ctx, dra.DriverOptions{
		Manager: n.mgr, Client: n.client, NodeName: node,
		RegistryDir: filepath.Join(n.dir, "reg"), PluginDir: filepath.Join(n.dir, "plugin"), CDIDir: filepath.Join(n.dir, "cdi"),
		Clock:  n.clock,
		Logger: ktesting.NewLogger(t, ktesting.NewConfig()),
	})
	require.NoError(t, err)
	n.conn, err = grpc.NewClient("unix://"+n.driver.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	n.stopFunc = sync.OnceFunc(func() {
		n.conn.Close()
		n.driver.Stop()
		cancel()
		require.NoError(t, n.mgr.Stop())
		n.plugin.Stop()
	})
	t.Cleanup(n.stop)
}

func (n *driverNode) stop() { n.stopFunc() }

// registerPlugin registers the current plugin and waits for its devices.
func (n *driverNode) registerPlugin() {
	require.NoError(n.t, n.plugin.Register(filepath.Join(n.dir, devicemanager.KubeletSocketName)))
	require.Eventually(n.t, func() bool {
		st := n.mgr.Status()
		return len(st) == 1 && len(st[0].Devices) == 3 && !st[0].RestoredFromCheckpoint
	}, 10*time.Second, 5*time.Millisecond, "the plugin's devices")
}

// allocateCalls returns the Allocate calls of every plugin started.
func (n *driverNode) allocateCalls() []plugintest.Call {
	var out []plugintest.Call
	for _, p := range n.plugins {
		out = append(out, p.CallsOf(plugintest.MethodAllocate)...)
	}
	return out
}

func allocatedClaim(name, uid string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + uid)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results},
		}},
	}
}

func result(request, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{
		Request: request, Driver: dra.DefaultDriverName, Pool: dra.PoolName(node, gpuRes), Device: device,
	}
}

func claimRef(c *resourceapi.ResourceClaim) *drapb.Claim {
	return &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}

// prepare calls NodePrepareResources as the kubelet does and returns the
// claim's answer.
func (n *driverNode) prepare(c *resourceapi.ResourceClaim) *drapb.NodePrepareResourceResponse {
	n.t.Helper()
	resp, err := drapb.NewDRAPluginClient(n.conn).NodePrepareResources(context.Background(),
		&drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{claimRef(c)}})
	require.NoError(n.t, err)
	require.Contains(n.t, resp.Claims, string(c.UID))
	return resp.Claims[string(c.UID)]
}

func (n *driverNode) unprepare(c *resourceapi.ResourceClaim) *drapb.NodeUnprepareResourceResponse {
	n.t.Helper()
	resp, err := drapb.NewDRAPluginClient(n.conn).NodeUnprepareResources(context.Background(),
		&drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{claimRef(c)}})
	require.NoError(n.t, err)
	require.Contains(n.t, resp.Claims, string(c.UID))
	return resp.Claims[string(c.UID)]
}

func (n *driverNode) specPath(c *resourceapi.ResourceClaim) string {
	return filepath.Join(n.dir, "cdi", dra.DefaultDriverName+"-claim_"+string(c.UID)+".json")
}

func (n *driverNode) spec(c *resourceapi.ResourceClaim) *cdispec.Spec {
	n.t.Helper()
	b, err := os.ReadFile(n.specPath(c))
	require.NoError(n.t, err)
	var s cdispec.Spec
	require.NoError(n.t, json.Unmarshal(b, &s))
	return &s
}

func (n *driverNode) claimed() []string {
	var out []string
	for _, d := range n.mgr.Status()[0].Devices {
		if d.Claimed {
			out = append(out, d.ID)
		}
	}
	return out
}

func TestPrepareReturnsACDIDeviceWithWhatAllocateReturned(t *testing.T) {
	c := allocatedClaim("two", "1", result("gpus", "gpu-0"), result("gpus", "gpu-2"))
	n := newDriverNode(t, c)

	got := n.prepare(c)
	require.Empty(t, got.Error)
	cdiID := dra.DefaultDriverName + "/claim=uid-1-gpus"
	require.Len(t, got.Devices, 2)
	assert.Equal(t, &drapb.Device{RequestNames: []string{"gpus"}, PoolName: "node-a/example.com/gpu", DeviceName: "gpu-0", CdiDeviceIds: []string{cdiID}}, got.Devices[0])
	assert.Equal(t, "gpu-2", got.Devices[1].DeviceName)
	assert.Empty(t, got.Devices[1].CdiDeviceIds, "the request's CDI device is named once")
	assert.Equal(t, cdiID, n.driver.CDIDeviceName(c.UID, "gpus"))

	allocs := n.allocateCalls()
	require.Len(t, allocs, 1)
	assert.Equal(t, []string{"gpu-0", "gpu-2"}, allocs[0].Request.(*pluginapi.AllocateRequest).ContainerRequests[0].DevicesIds)
	assert.Equal(t, []string{"gpu-0", "gpu-2"}, n.claimed())

	spec := n.spec(c)
	assert.Equal(t, dra.DefaultDriverName+"/claim", spec.Kind)
	require.Len(t, spec.Devices, 1)
	assert.Equal(t, "uid-1-gpus", spec.Devices[0].Name)
	e := spec.Devices[0].ContainerEdits
	assert.Equal(t, []string{"PLUGINTEST_EXAMPLE_COM_GPU=gpu-0,gpu-2"}, e.Env)
	require.Len(t, e.DeviceNodes, 2)
	assert.Equal(t, cdispec.DeviceNode{Path: "/dev/plugintest/example.com_gpu/gpu-0", HostPath: "/host/dev/plugintest/example.com_gpu/gpu-0", Permissions: "rw"}, *e.DeviceNodes[0])
	require.Len(t, e.Mounts, 2)
	assert.Equal(t, cdispec.Mount{HostPath: "/host/run/plugintest/example.com_gpu/gpu-0", ContainerPath: "/run/plugintest/example.com_gpu/gpu-0", Type: "bind", Options: []string{"rbind", "ro"}}, *e.Mounts[0])
}

func TestPreparedClaimsSurviveARestartAndUnprepareCleansUp(t *testing.T) {
	c := allocatedClaim("one", "1", result("gpu", "gpu-1"))
	n := newDriverNode(t, c)
	first := n.prepare(c)
	require.Empty(t, first.Error)
	before, err := os.ReadFile(n.specPath(c))
	require.NoError(t, err)

	n.stop()
	n.start()
	again := n.prepare(c)
	assert.Equal(t, first.String(), again.String(), "the same answer after the restart")
	assert.Len(t, n.allocateCalls(), 1, "and no second Allocate")
	after, err := os.ReadFile(n.specPath(c))
	require.NoError(t, err)
	assert.JSONEq(t, string(before), string(after))
	assert.Equal(t, []string{"gpu-1"}, n.claimed())

	assert.Empty(t, n.unprepare(c).Error)
	assert.NoFileExists(t, n.specPath(c))
	assert.Empty(t, n.claimed())
	assert.Empty(t, n.unprepare(c).Error, "unprepare is idempotent")
}

func TestPrepareRefusesWhatItCannotServe(t *testing.T) {
	busy := allocatedClaim("busy", "2", result("gpu", "gpu-0"))
	foreign := allocatedClaim("foreign", "3", result("gpu", "gpu-9"))
	unallocated := allocatedClaim("pending", "4")
	unallocated.Status.Allocation = nil
	first := allocatedClaim("first", "1", result("gpu", "gpu-0"))
	n := newDriverNode(t, first, busy, foreign, unallocated)
	require.Empty(t, n.prepare(first).Error)

	assert.Contains(t, n.prepare(busy).Error, `device "gpu-0" is held by pod "resourceclaim/uid-1"`)
	assert.Contains(t, n.prepare(foreign).Error, "device gpu-9 of pool node-a/example.com/gpu is not a device of this node's plugins")
	assert.NoFileExists(t, n.specPath(busy))
	assert.Equal(t, []string{"gpu-0"}, n.claimed())

	_, err := drapb.NewDRAPluginClient(n.conn).NodePrepareResources(context.Background(),
		&drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{claimRef(unallocated)}})
	require.ErrorContains(t, err, "claim default/pending not allocated")
}

// After a restart the kubelet may prepare a claim again before the plugin
// has listed its devices: the answer comes from the checkpoint.
func TestPrepareAgainBeforeThePluginIsBack(t *testing.T) {
	c := allocatedClaim("one", "1", result("gpu", "gpu-2"))
	n := newDriverNode(t, c)
	first := n.prepare(c)
	require.Empty(t, first.Error)
	n.stop()
	n.startWith(false)
	assert.Equal(t, first.String(), n.prepare(c).String())
	assert.Len(t, n.allocateCalls(), 1)
}

// The runtime accepts the spec: CDI's own cache injects the claim's device
// into an OCI spec, with the plugin's env, device nodes and mounts.
func TestTheSpecInjectsIntoAContainer(t *testing.T) {
	c := allocatedClaim("one", "1", result("gpu", "gpu-1"))
	n := newDriverNode(t, c)
	got := n.prepare(c)
	require.Empty(t, got.Error)
	cache, err := cdi.NewCache(cdi.WithSpecDirs(filepath.Join(n.dir, "cdi")), cdi.WithAutoRefresh(false))
	require.NoError(t, err)
	require.NotNil(t, cache.GetDevice(got.Devices[0].CdiDeviceIds[0]), "errors: %v", cache.GetErrors())
}

// The plugin's CDI annotations name CDI devices; a plugin's other
// annotations are dropped.
func TestPrepareTakesCDIDevicesFromAnnotations(t *testing.T) {
	c := allocatedClaim("one", "1", result("gpu", "gpu-0"))
	n := newDriverNode(t, c)
	n.plugin.SetAllocateFunc(func(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		resp := n.plugin.DefaultAllocate(req)
		resp.ContainerResponses[0].Annotations["cdi.k8s.io/vendor"] = "vendor.com/gpu=0"
		return resp, nil
	})
	got := n.prepare(c)
	require.Empty(t, got.Error)
	assert.Equal(t, []string{dra.DefaultDriverName + "/claim=uid-1-gpu", "vendor.com/gpu=0"}, got.Devices[0].CdiDeviceIds)
}

// Results of other drivers are theirs; a subrequest's name reaches the
// kubelet as its request's.
func TestPrepareTakesOnlyItsOwnResults(t *testing.T) {
	other := result("gpu", "their-device")
	other.Driver = "other.example.com"
	c := allocatedClaim("mixed", "1", result("gpus/big", "gpu-0"), other, result("gpus/big", "gpu-1"))
	n := newDriverNode(t, c)
	got := n.prepare(c)
	require.Empty(t, got.Error)
	require.Len(t, got.Devices, 2)
	assert.Equal(t, []string{"gpus"}, got.Devices[0].RequestNames)
	assert.Equal(t, []string{dra.DefaultDriverName + "/claim=uid-1-gpus_big"}, got.Devices[0].CdiDeviceIds)
	assert.Equal(t, []string{"gpu-0", "gpu-1"}, n.claimed())
}

// A claim fails as a whole: when its second request's device is another
// claim's, the device its first request got goes back.
func TestAFailingClaimHoldsNothing(t *testing.T) {
	first := allocatedClaim("first", "1", result("gpu", "gpu-1"))
	two := allocatedClaim("two", "2", result("a", "gpu-0"), result("b", "gpu-1"))
	n := newDriverNode(t, first, two)
	require.Empty(t, n.prepare(first).Error)
	assert.Contains(t, n.prepare(two).Error, `device "gpu-1" is held by pod "resourceclaim/uid-1"`)
	assert.Equal(t, []string{"gpu-1"}, n.claimed(), "gpu-0 went back")
	assert.Equal(t, []string{"uid-1"}, n.mgr.PreparedClaims())
	assert.Len(t, n.allocateCalls(), 2, "the first request of two was allocated, then released")
}

// Admin access shares a device with the claims that use it; a device
// plugin's device is one claim's or one pod's.
func TestPrepareRefusesAdminAccess(t *testing.T) {
	admin := result("watch", "gpu-1")
	admin.AdminAccess = ptr.To(true)
	c := allocatedClaim("admin", "1", admin)
	n := newDriverNode(t, c)
	assert.Contains(t, n.prepare(c).Error, "asks for admin access to gpu-1")
	assert.Empty(t, n.mgr.PreparedClaims())
}

// A claim the API server no longer has allocated is unprepared at the next
// sweep; the others stay.
func TestSweepUnpreparesClaimsThatAreGone(t *testing.T) {
	gone := allocatedClaim("gone", "1", result("gpu", "gpu-0"))
	kept := allocatedClaim("kept", "2", result("gpu", "gpu-1"))
	n := newDriverNode(t, gone, kept)
	require.Empty(t, n.prepare(gone).Error)
	require.Empty(t, n.prepare(kept).Error)
	require.NoError(t, n.client.ResourceV1().ResourceClaims("default").Delete(context.Background(), "gone", metav1.DeleteOptions{}))

	require.Eventually(t, func() bool {
		n.clock.Step(dra.DefaultSweepInterval)
		return slices.Equal(n.mgr.PreparedClaims(), []string{"uid-2"})
	}, 10*time.Second, 10*time.Millisecond)
	assert.NoFileExists(t, n.specPath(gone))
	assert.FileExists(t, n.specPath(kept))
}

// A claim prepared before keeps its devices when preparing it again fails:
// its containers may be running.
func TestAFailedPrepareAgainKeepsThePreparedClaim(t *testing.T) {
	c := allocatedClaim("one", "1", result("gpu", "gpu-0"))
	n := newDriverNode(t, c)
	require.Empty(t, n.prepare(c).Error)
	// The spec cannot be written again: a directory stands in its place.
	require.NoError(t, os.Remove(n.specPath(c)))
	require.NoError(t, os.MkdirAll(filepath.Join(n.specPath(c), "x"), 0o750))

	assert.Contains(t, n.prepare(c).Error, "write its CDI spec")
	assert.Equal(t, []string{"gpu-0"}, n.claimed())
}
