package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	regapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/openkubelet/devmgr/dra"
	"github.com/openkubelet/devmgr/e2e/cluster"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/pluginwatcher"
)

const (
	gpuClass = "devmgr-gpu"
	gpuPool  = nodeName + "/" + gpu
	// sliceBound is how soon a device list must reach the ResourceSlices:
	// devmgr reads the manager every second.
	sliceBound = 5 * time.Second
)

// An unmodified device plugin's devices, published by devmgr serve --dra
// as ResourceSlices, are what the real scheduler allocates ResourceClaims
// from: as many claims as healthy devices, never an unhealthy one, and the
// claim over capacity stays Pending until a device comes back.
func TestDevmgrPublishesResourceSlicesTheSchedulerAllocates(t *testing.T) {
	sn := startServeCluster(t, "--register-node", "--dra")
	c, devmgr, sockDir, ctx := sn.c, sn.devmgr, sn.sockDir, sn.ctx

	// 1. The plugin's first list becomes a pool of four devices.
	gpus := plugin(t, sockDir, gpu, 4)
	took := waitSlices(t, ctx, c, devmgr, "4 devices", time.Minute, func(devs []string) bool { return len(devs) == 4 })
	t.Logf("FIGURE first list to slice: pool %s with 4 devices %s after the plugin registered", gpuPool, took)

	// 2. A device turning unhealthy leaves the pool.
	devs := devices("gpu", 4)
	devs[3].Health = pluginapi.Unhealthy
	gpus.Update(devs)
	took = waitSlices(t, ctx, c, devmgr, "gpu-3 gone", sliceBound, func(d []string) bool {
		return slices.Equal(d, []string{"gpu-0", "gpu-1", "gpu-2"})
	})
	t.Logf("FIGURE unhealthy device: gpu-3 left the pool %s after the plugin reported it (bound %s)", took, sliceBound)

	// 3. Four claims of one device each: the scheduler allocates three,
	// from the healthy devices, and leaves the fourth Pending.
	becomeReadyNode(t, ctx, c)
	createDefaultServiceAccount(t, ctx, c)
	createDeviceClass(t, ctx, c)
	schedStart := time.Now()
	for i := range 4 {
		createClaimPod(t, ctx, c, fmt.Sprintf("claim-%d", i))
	}
	var allocated map[string]string
	var pending, reason string
	cluster.Poll(t, ctx, c.Scheduler, "3 claims allocated and 1 pod unschedulable", time.Minute, func() bool {
		allocated, pending, reason = claimState(ctx, c)
		return len(allocated) == 3 && pending != ""
	})
	var held []string
	for _, d := range allocated {
		held = append(held, d)
	}
	slices.Sort(held)
	if !slices.Equal(held, []string{"gpu-0", "gpu-1", "gpu-2"}) {
		t.Fatalf("claims hold %v, want each healthy device once", allocated)
	}
	t.Logf("FIGURE scheduler: claims %v allocated within %s; pod %s Pending: %q", allocated, time.Since(schedStart).Round(time.Millisecond), pending, reason)

	// 4. The device healthy again: the Pending claim gets it.
	devs[3].Health = pluginapi.Healthy
	gpus.Update(devs)
	healed := time.Now()
	cluster.Poll(t, ctx, c.Scheduler, pending+" allocated", time.Minute, func() bool {
		allocated, _, _ = claimState(ctx, c)
		return allocated[pending] == "gpu-3"
	})
	t.Logf("FIGURE device healthy again: claim %s allocated gpu-3 %s later", pending, time.Since(healed).Round(time.Millisecond))

	// 5. The kubelet's side: the driver registers in the plugins registry;
	// preparing each claim through it, as the kubelet does, allocates its
	// device through the plugin and returns a CDI device whose spec holds
	// the plugin's answer. The node's allocatable leaves claimed devices out.
	reg := watchRegistry(t, filepath.Join(sn.dir, "registry"))
	kubelet := reg.client(t, ctx, devmgr, 1)
	claims := allocatedClaims(t, ctx, c)
	var slowest time.Duration
	for _, cl := range claims {
		start := time.Now()
		prepareClaim(t, ctx, kubelet, sn.dir, cl, allocated[cl.Name])
		slowest = max(slowest, time.Since(start))
	}
	if n := len(gpus.CallsOf(plugintest.MethodAllocate)); n != 4 {
		t.Fatalf("the plugin got %d Allocate calls for 4 claims", n)
	}
	t.Logf("FIGURE allocated claim to prepared: each of 4 claims prepared within %s (NodePrepareResources through the registered driver)", slowest.Round(time.Millisecond))
	waitAllocatable(t, ctx, c, devmgr, 0)
	waitSlices(t, ctx, c, devmgr, "claimed devices stay", sliceBound, func(d []string) bool { return len(d) == 4 })

	// 6. serve restarts: the plugin registers again by itself, as real
	// plugins do, and the claims stay prepared without a second Allocate.
	if code := devmgr.Stop(); code != 0 {
		t.Fatalf("devmgr serve exited %d on SIGTERM", code)
	}
	gpus.ResetCalls()
	sn.startServe(t)
	devmgr = sn.devmgr
	kubelet = reg.client(t, ctx, devmgr, 2)
	waitSlices(t, ctx, c, devmgr, "4 devices after the restart", time.Minute, func(d []string) bool { return len(d) == 4 })
	for _, cl := range claims {
		prepareClaim(t, ctx, kubelet, sn.dir, cl, allocated[cl.Name])
	}
	if n := len(gpus.CallsOf(plugintest.MethodAllocate)); n != 0 {
		t.Fatalf("after the restart, preparing the claims again called Allocate %d times", n)
	}

	// 7. Unpreparing removes each spec and frees the devices.
	for _, cl := range claims {
		resp, err := kubelet.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{claimRef(cl)}})
		if err != nil || resp.Claims[string(cl.UID)].GetError() != "" {
			t.Fatalf("unprepare %s: %v %v", cl.Name, err, resp)
		}
		if exists(specPath(sn.dir, cl)) {
			t.Fatalf("the CDI spec of %s is still there", cl.Name)
		}
	}
	waitAllocatable(t, ctx, c, devmgr, 4)
	if code := devmgr.Stop(); code != 0 {
		t.Fatalf("devmgr serve exited %d on SIGTERM", code)
	}
}

// A pod that asks for the plugin's resource as it always has
// (example.com/gpu: 1) is served through DRA when serve makes the
// resource's DeviceClass and leaves the resource out of the Node status: the
// real scheduler makes the pod's claim, allocates it from devmgr's slices,
// and devmgr prepares it.
func TestExtendedResourceRequestsAreServedThroughDRA(t *testing.T) {
	sn := startServeCluster(t, "--dra", "--dra-device-classes", "--no-node-status")
	c, devmgr, ctx := sn.c, sn.devmgr, sn.ctx
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	becomeReadyNode(t, ctx, c)
	createDefaultServiceAccount(t, ctx, c)
	reg := watchRegistry(t, filepath.Join(sn.dir, "registry"))

	gpus := plugin(t, sn.sockDir, gpu, 2)
	start := time.Now()
	class := dra.DeviceClassName(gpu)
	cluster.Poll(t, ctx, devmgr, "DeviceClass "+class, 30*time.Second, func() bool {
		dc, err := c.Client.ResourceV1().DeviceClasses().Get(ctx, class, metav1.GetOptions{})
		return err == nil && dc.Spec.ExtendedResourceName != nil && *dc.Spec.ExtendedResourceName == gpu
	})
	waitSlices(t, ctx, c, devmgr, "2 devices", time.Minute, func(d []string) bool { return len(d) == 2 })
	t.Logf("FIGURE extended resource via DRA: DeviceClass %s and a pool of 2 devices %s after the plugin registered", class, since(start))
	if _, ok := node(t, ctx, c).Status.Allocatable[gpu]; ok {
		t.Fatalf("the Node status advertises %s with --no-node-status", gpu)
	}

	schedStart := time.Now()
	for i := range 3 {
		createGPUPod(t, ctx, c, fmt.Sprintf("gpu-%d", i))
	}
	claimOf := map[string]string{} // pod -> its claim
	var pending string
	cluster.Poll(t, ctx, c.Scheduler, "2 pods bound with claims, 1 unschedulable", time.Minute, func() bool {
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		clear(claimOf)
		pending = ""
		for _, p := range pods.Items {
			if st := p.Status.ExtendedResourceClaimStatus; p.Spec.NodeName == nodeName && st != nil {
				claimOf[p.Name] = st.ResourceClaimName
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == v1.PodScheduled && cond.Reason == v1.PodReasonUnschedulable {
					pending = p.Name
				}
			}
		}
		return len(claimOf) == 2 && pending != ""
	})
	t.Logf("FIGURE extended resource via DRA: pods %v bound with their claims within %s; %s Pending", claimOf, since(schedStart), pending)

	kubelet := reg.client(t, ctx, devmgr, 1)
	var held []string
	for _, cl := range allocatedClaims(t, ctx, c) {
		if !slices.Contains(slices.Collect(maps.Values(claimOf)), cl.Name) {
			continue
		}
		r := cl.Status.Allocation.Devices.Results
		if len(r) != 1 || r[0].Pool != gpuPool {
			t.Fatalf("claim %s holds %v, want one device of %s", cl.Name, r, gpuPool)
		}
		prepareClaim(t, ctx, kubelet, sn.dir, cl, r[0].Device)
		held = append(held, r[0].Device)
	}
	slices.Sort(held)
	if !slices.Equal(held, []string{"gpu-0", "gpu-1"}) {
		t.Fatalf("the claims hold %v, want each device once", held)
	}
	if n := len(gpus.CallsOf(plugintest.MethodAllocate)); n != 2 {
		t.Fatalf("the plugin got %d Allocate calls for 2 claims", n)
	}
	if code := devmgr.Stop(); code != 0 {
		t.Fatalf("devmgr serve exited %d on SIGTERM", code)
	}
}

func since(t time.Time) time.Duration { return time.Since(t).Round(10 * time.Millisecond) }

// registry plays the kubelet's plugin watcher for DRA drivers: it records
// the endpoint of each registration.
type registry struct {
	mu        sync.Mutex
	endpoints []string
}

func watchRegistry(t *testing.T, dir string) *registry {
	t.Helper()
	r := &registry{}
	w, err := pluginwatcher.Start(pluginwatcher.Options{Dir: dir, Handlers: map[string]pluginwatcher.Handler{regapi.DRAPlugin: r}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return r
}

func (r *registry) ValidatePlugin(_, _ string, versions []string) error {
	if !slices.Contains(versions, drapb.DRAPluginService) {
		return fmt.Errorf("no %s in %v", drapb.DRAPluginService, versions)
	}
	return nil
}

func (r *registry) RegisterPlugin(_, endpoint string, _ []string, _ *time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endpoints = append(r.endpoints, endpoint)
	return nil
}

func (r *registry) DeRegisterPlugin(string, string) {}

// client waits for the n-th registration and dials its endpoint.
func (r *registry) client(t *testing.T, ctx context.Context, p *cluster.Process, n int) drapb.DRAPluginClient {
	t.Helper()
	var endpoint string
	cluster.Poll(t, ctx, p, fmt.Sprintf("registration %d of the DRA driver", n), 30*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.endpoints) < n {
			return false
		}
		endpoint = r.endpoints[n-1]
		return true
	})
	conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return drapb.NewDRAPluginClient(conn)
}

// allocatedClaims returns the claims of the default namespace, by name.
func allocatedClaims(t *testing.T, ctx context.Context, c *cluster.Cluster) []resourceapi.ResourceClaim {
	t.Helper()
	list, err := c.Client.ResourceV1().ResourceClaims("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(list.Items, func(a, b resourceapi.ResourceClaim) int { return strings.Compare(a.Name, b.Name) })
	return list.Items
}

func claimRef(cl resourceapi.ResourceClaim) *drapb.Claim {
	return &drapb.Claim{Namespace: cl.Namespace, Name: cl.Name, Uid: string(cl.UID)}
}

func specPath(dir string, cl resourceapi.ResourceClaim) string {
	return filepath.Join(dir, "cdi", dra.DefaultDriverName+"-"+dra.CDIClass+"_"+string(cl.UID)+".json")
}

// prepareClaim prepares cl, whose one request holds device, and checks
// the answer: the device, one CDI device of devmgr's, and its spec with the
// environment the plugin's Allocate returned.
func prepareClaim(t *testing.T, ctx context.Context, kubelet drapb.DRAPluginClient, dir string, cl resourceapi.ResourceClaim, device string) {
	t.Helper()
	resp, err := kubelet.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{claimRef(cl)}})
	if err != nil {
		t.Fatalf("prepare %s: %v", cl.Name, err)
	}
	got := resp.Claims[string(cl.UID)]
	request := cl.Status.Allocation.Devices.Results[0].Request
	cdiID := dra.DefaultDriverName + "/" + dra.CDIClass + "=" + string(cl.UID) + "-" + request
	if got.GetError() != "" || len(got.Devices) != 1 || got.Devices[0].DeviceName != device ||
		!slices.Equal(got.Devices[0].CdiDeviceIds, []string{cdiID}) {
		t.Fatalf("prepare %s: got %v, want device %s with CDI device %s", cl.Name, got, device, cdiID)
	}
	b, err := os.ReadFile(specPath(dir, cl))
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	want := "PLUGINTEST_EXAMPLE_COM_GPU=" + device
	if len(spec.Devices) != 1 || !slices.Contains(spec.Devices[0].ContainerEdits.Env, want) {
		t.Fatalf("the CDI spec of %s holds %s, want %s in its one device", cl.Name, b, want)
	}
}

// waitAllocatable waits until the Node's allocatable gpus are n.
func waitAllocatable(t *testing.T, ctx context.Context, c *cluster.Cluster, p *cluster.Process, n int64) {
	t.Helper()
	cluster.Poll(t, ctx, p, fmt.Sprintf("allocatable %s = %d", gpu, n), time.Minute, func() bool {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		q, ok := node.Status.Allocatable[v1.ResourceName(gpu)]
		return ok && q.Value() == n
	})
}

// waitSlices waits until the devices of the gpu pool (their names, sorted)
// satisfy cond, and returns how long that took.
func waitSlices(t *testing.T, ctx context.Context, c *cluster.Cluster, p *cluster.Process, what string, limit time.Duration, cond func([]string) bool) time.Duration {
	t.Helper()
	start := time.Now()
	cluster.Poll(t, ctx, p, "ResourceSlices: "+what, limit, func() bool {
		list, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		var devs []string
		for _, s := range list.Items {
			if s.Spec.Driver == dra.DefaultDriverName && s.Spec.Pool.Name == gpuPool {
				for _, d := range s.Spec.Devices {
					devs = append(devs, d.Name)
				}
			}
		}
		slices.Sort(devs)
		return cond(devs)
	})
	return time.Since(start).Round(10 * time.Millisecond)
}

// createDeviceClass makes the class of the plugin's gpus: devices of
// devmgr's driver whose resourceName attribute is the gpu resource.
func createDeviceClass(t *testing.T, ctx context.Context, c *cluster.Cluster) {
	t.Helper()
	expr := fmt.Sprintf("device.driver == %q && device.attributes[%q].%s == %q",
		dra.DefaultDriverName, dra.DefaultDriverName, dra.AttributeResourceName, gpu)
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: gpuClass},
		Spec:       resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}},
	}
	if _, err := c.Client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createClaimPod makes a claim of one gpu and a pod that uses it, both
// named name.
func createClaimPod(t *testing.T, ctx context.Context, c *cluster.Cluster, name string) {
	t.Helper()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}
	if _, err := c.Client.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.PodSpec{
			AutomountServiceAccountToken: new(false),
			ResourceClaims:               []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: new(name)}},
			Containers: []v1.Container{{Name: "main", Image: "example.invalid/job",
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
		},
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// claimState returns the device each allocated claim holds (from devmgr's
// pool on this node), and a pod the scheduler left unschedulable with its
// reason.
func claimState(ctx context.Context, c *cluster.Cluster) (allocated map[string]string, pending, reason string) {
	allocated = map[string]string{}
	claims, err := c.Client.ResourceV1().ResourceClaims("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return allocated, "", ""
	}
	for _, cl := range claims.Items {
		if a := cl.Status.Allocation; a != nil {
			for _, r := range a.Devices.Results {
				if r.Driver == dra.DefaultDriverName && r.Pool == gpuPool {
					allocated[cl.Name] = r.Device
				}
			}
		}
	}
	pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return allocated, "", ""
	}
	for _, p := range pods.Items {
		for _, cond := range p.Status.Conditions {
			if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable &&
				strings.HasPrefix(p.Name, "claim-") {
				pending, reason = p.Name, cond.Message
			}
		}
	}
	return allocated, pending, reason
}
