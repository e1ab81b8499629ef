package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/dra"
	"github.com/openkubelet/devmgr/e2e/cluster"
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

	if code := devmgr.Stop(); code != 0 {
		t.Fatalf("devmgr serve exited %d on SIGTERM", code)
	}
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
