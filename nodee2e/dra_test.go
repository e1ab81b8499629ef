package nodee2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openkubelet/devmgr/dra"
	"github.com/openkubelet/devmgr/e2e/cluster"
)

// The DRA bridge on the node: devmgr serve --dra runs as a process of its
// own beside the kubelet, with a device plugin of draResource registered
// on serve's socket directory (not the kubelet's). serve publishes the
// plugin's devices as ResourceSlices and registers as the DRA driver
// draDriver in the kubelet's plugins registry; the kubelet's DRA manager
// asks it to prepare the claims of the pods it runs, and containerd applies
// the CDI spec serve wrote in cdiDir. With --dra-device-classes serve also
// makes the DeviceClass that serves draResource as an extended resource
// (KEP-5004): a pod asking for it as before gets a claim the scheduler
// makes. The kubelet's DRA manager is the kubelet's own on both kubelets:
// devmgr replaces only the device manager.
const (
	draResource = "example.com/dra-fpga"
	draDriver   = dra.DefaultDriverName
	// draRequest is the claim's one request; draPod the pod of the claim,
	// extendedPod the pod asking for draResource as an extended resource.
	draRequest  = "fpga"
	draPod      = "claimed"
	extendedPod = "extended"
	// draLimit bounds how soon serve serves, the kubelet registers the
	// driver, and a device list reaches the ResourceSlices.
	draLimit = time.Minute
)

// draRegisteredLine matches what the kubelet logs (-v 2) when it has
// connected to a DRA driver it registered from its plugins registry.
var draRegisteredLine = regexp.MustCompile(`"Connection changed".*driverName="` + regexp.QuoteMeta(draDriver) + `".*connected=true`)

// draBridge is devmgr serve --dra on the node, and its device plugin.
type draBridge struct {
	proc      *cluster.Process
	socketDir string
	control   string
	plugin    *fpgaPlugin
}

// startDRABridge starts devmgr serve --dra for the node, its sockets,
// checkpoint and log in the node's directory, the kubelet's plugins
// registry and plugins directory under the kubelet's root, and its CDI
// specs where containerd reads them. The Node's status is the kubelet's
// (--no-node-status): advertised there, the plugin's resource would be
// served the device-plugin way, by a kubelet whose device manager does not
// know it, and so without a device. It returns once serve serves its
// kubelet.sock and the kubelet has connected to its DRA driver, with the
// time the latter took. serve stops when the test ends.
func (n *node) startDRABridge(t *testing.T) (*draBridge, time.Duration) {
	t.Helper()
	dir := filepath.Join(n.dir, "dra")
	b := &draBridge{socketDir: filepath.Join(dir, "dp"), control: filepath.Join(dir, "control.sock")}
	checkpoints := filepath.Join(dir, "checkpoint")
	for _, d := range []string{b.socketDir, checkpoints} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(the.Bins.Devmgr, "serve", "-v", "2", "--socket-dir", b.socketDir, "--checkpoint-dir", checkpoints,
		"--control-socket", b.control, "--numa-nodes", "0", "--kubeconfig", n.c.Kubeconfig, "--node-name", n.k.node, "--no-node-status",
		"--dra", "--dra-device-classes", "--dra-driver", draDriver, "--dra-registry-dir", filepath.Join(kubeletRoot, "plugins_registry"),
		"--dra-plugin-dir", filepath.Join(kubeletRoot, "plugins", draDriver), "--cdi-dir", cdiDir)
	start := time.Now()
	b.proc = cluster.StartCmd(t, n.dir, "devmgr-serve-dra", cmd)
	ctx := context.Background()
	cluster.Poll(t, ctx, b.proc, "devmgr serve's kubelet.sock", draLimit, func() bool {
		_, err := os.Stat(filepath.Join(b.socketDir, "kubelet.sock"))
		return err == nil
	})
	cluster.Poll(t, ctx, b.proc, "the kubelet connected to the DRA driver "+draDriver, draLimit, func() bool {
		return n.k.proc.Running() && draRegisteredLine.MatchString(n.k.proc.Output())
	})
	return b, since(start)
}

// waitPool waits until devmgr's pool of draResource on the node lists
// count devices, and returns each device's plugin ID (its deviceID
// attribute) by device name, and how long that took.
func (b *draBridge) waitPool(t *testing.T, n *node, count int) (map[string]string, time.Duration) {
	t.Helper()
	start := time.Now()
	pool := dra.PoolName(n.k.node, draResource)
	var ids map[string]string
	cluster.Poll(t, context.Background(), b.proc, fmt.Sprintf("ResourceSlices of pool %s with %d devices", pool, count), draLimit, func() bool {
		list, err := n.c.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		ids = map[string]string{}
		for _, s := range list.Items {
			if s.Spec.Driver != draDriver || s.Spec.Pool.Name != pool || s.Spec.NodeName == nil || *s.Spec.NodeName != n.k.node {
				continue
			}
			for _, d := range s.Spec.Devices {
				if id := d.Attributes[dra.AttributeDeviceID].StringValue; id != nil {
					ids[d.Name] = *id
				}
			}
		}
		return len(ids) == count
	})
	return ids, since(start)
}

// allocated returns, by ID, whether each device of draResource is
// allocated, as devmgr status tells through serve's control socket.
func (b *draBridge) allocated(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command(the.Bins.Devmgr, "status", "--control-socket", b.control, "--json").Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("devmgr status: %v: %s", err, exit.Stderr)
		}
		t.Fatalf("devmgr status: %v", err)
	}
	var st struct {
		Resources []struct {
			Name    string `json:"name"`
			Devices []struct {
				ID        string `json:"id"`
				Allocated bool   `json:"allocated"`
			} `json:"devices"`
		} `json:"resources"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("devmgr status --json: %v\n%s", err, out)
	}
	got := map[string]bool{}
	for _, r := range st.Resources {
		if r.Name == draResource {
			for _, d := range r.Devices {
				got[d.ID] = d.Allocated
			}
		}
	}
	return got
}

// claimSpecPath is the CDI spec devmgr writes for a claim (one file per
// claim, named as tags.cncf.io/container-device-interface names transient
// specs).
func claimSpecPath(uid string) string {
	return filepath.Join(cdiDir, draDriver+"-"+dra.CDIClass+"_"+uid+".json")
}

// draClaimPod is a pod of one running container that uses the claim of
// one device of class.
func draClaimPod(ns, class string) (*resourceapi.ResourceClaim, *v1.Pod) {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: draPod, Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    draRequest,
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}
	pod := devicePod(ns, draPod, nil)
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "devices", ResourceClaimName: new(claim.Name)}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "devices"}}
	return claim, pod
}

// createDeviceClass makes a DeviceClass of the devices devmgr publishes
// for resource, as docs/SERVE.md shows, and returns its name.
func createDeviceClass(t *testing.T, c *cluster.Cluster, name, resource string) string {
	t.Helper()
	expr := fmt.Sprintf("device.driver == %q && device.attributes[%q].%s == %q", draDriver, draDriver, dra.AttributeResourceName, resource)
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}},
	}
	if _, err := c.Client.ResourceV1().DeviceClasses().Create(context.Background(), class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// claimScenario runs a pod with a ResourceClaim of a device that devmgr
// serve --dra publishes and prepares, then a pod asking for draResource as
// an extended resource: each container sees what the plugin's Allocate and
// CDI spec give for the device the scheduler allocated, and deleting the
// pod unprepares the claim.
func claimScenario(t *testing.T, n *node) {
	var b *draBridge
	var ids map[string]string // plugin IDs by device name
	step(t, n.k.kind, "a pod with a ResourceClaim: devmgr serve --dra prepares it for the kubelet's DRA manager, the container sees the device's env, mount, device node, CDI edits",
		func(s *scenario) {
			ctx := context.Background()
			var registered, published time.Duration
			b, registered = n.startDRABridge(t)
			b.plugin = newFPGAPlugin(t, filepath.Join(n.dir, "dra", "fpga"), draResource, b.socketDir)
			b.plugin.start(t)
			ids, published = b.waitPool(t, n, fpgaCount)
			s.figure(t, "kubelet connected to the driver %s after serve started; pool %s of %d devices published %s after the plugin registered",
				registered, dra.PoolName(n.k.node, draResource), fpgaCount, published)
			// Registered after serve's own cleanup, so run before it: the
			// kubelet needs serve to unprepare the claim of a pod it stops.
			t.Cleanup(func() {
				for _, name := range []string{draPod, extendedPod} {
					if _, err := n.c.Client.CoreV1().Pods(n.ns).Get(ctx, name, metav1.GetOptions{}); err == nil && n.k.proc.Running() {
						deletePods(t, n.c, n.k, n.ns, name)
					}
				}
			})

			class := createDeviceClass(t, n.c, n.ns+"-dra-fpga", draResource)
			claim, pod := draClaimPod(n.ns, class)
			if _, err := n.c.Client.ResourceV1().ResourceClaims(n.ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			p, took := startPod(t, n.c, n.k, pod)
			s.figure(t, "claim pod Running %s after creation", took)
			id, spec, seen := b.requirePrepared(t, n, p, claim.Name, draRequest, ids, 1)
			s.figure(t, "the container sees what Allocate and the CDI spec give for %s: %s", id, seen)
			s.figure(t, "pod deleted: its CDI spec removed %s later, every device free in devmgr status", b.deleteAndRequireUnprepared(t, n, draPod, spec, 1))
		})

	step(t, n.k.kind, "a pod asking for a device plugin's resource, served through DRA (serve --dra-device-classes): the scheduler's claim is prepared, the container sees the device",
		func(s *scenario) {
			ctx := context.Background()
			if b == nil {
				t.Fatal("devmgr serve --dra did not start in the scenario before")
			}
			class := dra.DeviceClassName(draResource)
			cluster.Poll(t, ctx, b.proc, "DeviceClass "+class, draLimit, func() bool {
				c, err := n.c.Client.ResourceV1().DeviceClasses().Get(ctx, class, metav1.GetOptions{})
				return err == nil && c.Spec.ExtendedResourceName != nil && *c.Spec.ExtendedResourceName == draResource
			})
			p, took := startPod(t, n.c, n.k, devicePod(n.ns, extendedPod, devices(map[string]int64{draResource: 1})))
			st := p.Status.ExtendedResourceClaimStatus
			if st == nil || len(st.RequestMappings) != 1 || st.RequestMappings[0].ContainerName != "main" ||
				st.RequestMappings[0].ResourceName != draResource {
				t.Fatalf("pod %s runs with extended resource claim status %+v, want its container's %s mapped to a claim", extendedPod, st, draResource)
			}
			s.figure(t, "pod asking for %s: 1 Running %s after creation, on a claim the scheduler made", draResource, took)
			id, spec, seen := b.requirePrepared(t, n, p, st.ResourceClaimName, st.RequestMappings[0].RequestName, ids, 2)
			s.figure(t, "the container sees what Allocate and the CDI spec give for %s: %s", id, seen)
			s.figure(t, "pod deleted: its CDI spec removed %s later, every device free in devmgr status",
				b.deleteAndRequireUnprepared(t, n, extendedPod, spec, 2))
		})
}

// requirePrepared fails unless the running pod p's claim is allocated one
// device of serve's pool for request, prepared (its CDI spec written, the
// plugin's Allocate called for the calls-th time, the device alone held in
// devmgr status), and its container sees exactly what the plugin's answer
// and CDI spec give for that device. It returns the device's plugin ID,
// the claim's CDI spec, and what the container saw.
func (b *draBridge) requirePrepared(t *testing.T, n *node, p *v1.Pod, claimName, request string, ids map[string]string, calls int) (id, spec, seen string) {
	t.Helper()
	claim, err := n.c.Client.ResourceV1().ResourceClaims(n.ns).Get(context.Background(), claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s of running pod %s: allocation %+v, want one device", claimName, p.Name, claim.Status.Allocation)
	}
	pool := dra.PoolName(n.k.node, draResource)
	res := claim.Status.Allocation.Devices.Results[0]
	id, ok := ids[res.Device]
	if res.Driver != draDriver || res.Pool != pool || res.Request != request || !ok {
		t.Fatalf("claim %s allocated %+v, want a device of %s's pool %s for request %s", claimName, res, draDriver, pool, request)
	}
	spec = claimSpecPath(string(claim.UID))
	if _, err := os.Stat(spec); err != nil {
		t.Fatalf("the CDI spec of claim %s: %v", claimName, err)
	}
	if got := b.plugin.allocateCalls(); got != calls {
		t.Fatalf("the plugin got %d Allocate calls, want %d: one per claim", got, calls)
	}
	wantHeld := map[string]bool{}
	for _, i := range ids {
		wantHeld[i] = i == id
	}
	if held := b.allocated(t); !maps.Equal(held, wantHeld) {
		t.Fatalf("devmgr status: devices allocated %v, want %v (claim %s's %s alone)", held, wantHeld, claimName, id)
	}
	got, want := containerReport(t, p, "main"), b.plugin.expectedReport(t, []string{id}, nil)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the container of pod %s (claim %s, device %s) sees\n%+v\nthe plugin's Allocate answer and CDI spec give\n%+v", p.Name, claimName, id, got, want)
	}
	return id, spec, fmt.Sprintf("%d variables, %d read-only mount, %d device node", len(got.env), len(got.mounts), len(got.devices))
}

// deleteAndRequireUnprepared deletes the pod, waits until the kubelet has
// unprepared its claim (the CDI spec removed, every device free in devmgr
// status) and the pod is gone, and fails if the plugin's Allocate was
// called again (it had calls). It returns how long the spec took to go.
func (b *draBridge) deleteAndRequireUnprepared(t *testing.T, n *node, pod, spec string, calls int) time.Duration {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	if err := n.c.Client.CoreV1().Pods(n.ns).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	cluster.Poll(t, ctx, n.k.proc, "the CDI spec of pod "+pod+"'s claim removed", podStartLimit, func() bool {
		_, err := os.Stat(spec)
		return errors.Is(err, os.ErrNotExist)
	})
	removed := since(start)
	cluster.Poll(t, ctx, b.proc, "devmgr status: every device free", statusLimit, func() bool {
		held := b.allocated(t)
		return len(held) == fpgaCount && !slices.Contains(slices.Collect(maps.Values(held)), true)
	})
	cluster.Poll(t, ctx, n.k.proc, "pod "+pod+" gone", podStartLimit, func() bool {
		_, err := n.c.Client.CoreV1().Pods(n.ns).Get(ctx, pod, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if got := b.plugin.allocateCalls(); got != calls {
		t.Fatalf("the plugin got %d Allocate calls by pod %s's end, want %d", got, pod, calls)
	}
	return removed
}
