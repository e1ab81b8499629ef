// Package e2e checks devmgr serve against a real API server, scheduler and
// etcd: the devices it publishes in a Node's status are what the scheduler
// places pods by. Each check logs the figure it measured.
package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/dra"
	"github.com/openkubelet/devmgr/e2e/cluster"
	"github.com/openkubelet/devmgr/nodestatus"
	"github.com/openkubelet/devmgr/plugintest"
)

const (
	nodeName    = "e2e-node"
	gpu         = "example.com/gpu"
	fpga        = "example.com/fpga"
	nic         = "example.com/nic" // advertised by another agent
	agent       = "e2e-node-agent"  // that agent's field manager
	gracePeriod = 5 * time.Second   // devmgr serve --stop-grace-period
	// publishBound is how soon a change must reach the node status:
	// devmgr reads the manager every second.
	publishBound = 5 * time.Second
)

func TestDevmgrPublishesDevicesTheSchedulerUses(t *testing.T) {
	sn := startServeCluster(t, "--stop-grace-period", gracePeriod.String(), "--metrics-address", "127.0.0.1:0", "--register-node")
	c, devmgr, sockDir, ctx, serveStart := sn.c, sn.devmgr, sn.sockDir, sn.ctx, sn.started
	dir := filepath.Dir(sockDir)

	gpus := plugin(t, sockDir, gpu, 4)
	fpgas := plugin(t, sockDir, fpga, 2)

	// 1. Capacity appears.
	took := waitNode(t, ctx, c, devmgr, "gpu 4/4 and fpga 2/2", time.Minute, func(n *v1.Node) bool {
		return has(n, gpu, 4, 4) && has(n, fpga, 2, 2)
	})
	t.Logf("FIGURE capacity appeared: %s=4/4 %s=2/2 (capacity/allocatable) %s after devmgr serve started (registration included: %s after the plugins)",
		gpu, fpga, time.Since(serveStart).Round(time.Millisecond), took)

	// The rest of the node agent: Ready, cpu, memory, pods and a resource
	// of its own, under its own field manager; no taints.
	becomeReadyNode(t, ctx, c)

	// 2. A device turning unhealthy lowers allocatable.
	devs := devices("gpu", 4)
	devs[3].Health = pluginapi.Unhealthy
	gpus.Update(devs)
	took = waitNode(t, ctx, c, devmgr, "gpu 4/3", publishBound, func(n *v1.Node) bool { return has(n, gpu, 4, 3) })
	t.Logf("FIGURE unhealthy device: %s allocatable 4 -> 3 in the node status %s after the plugin reported it (bound %s)", gpu, took, publishBound)

	// 3. A plugin gone: allocatable 0 for the grace period, then removed.
	stopped := time.Now()
	fpgas.Stop()
	took = waitNode(t, ctx, c, devmgr, "fpga 2/0", publishBound, func(n *v1.Node) bool { return has(n, fpga, 2, 0) })
	t.Logf("FIGURE plugin stopped: %s allocatable 2 -> 0 after %s", fpga, took)
	waitNode(t, ctx, c, devmgr, "fpga removed", gracePeriod+publishBound+2*time.Second, func(n *v1.Node) bool {
		_, inCapacity := n.Status.Capacity[fpga]
		_, inAllocatable := n.Status.Allocatable[fpga]
		return !inCapacity && !inAllocatable
	})
	gone := time.Since(stopped)
	if gone < gracePeriod {
		t.Fatalf("%s removed %s after its plugin stopped, before the grace period %s", fpga, gone, gracePeriod)
	}
	t.Logf("FIGURE plugin gone: %s removed from the node status %s after its plugin stopped (grace period %s)", fpga, gone.Round(time.Millisecond), gracePeriod)

	// 4. The scheduler binds pods while allocatable allows (3), no more.
	createDefaultServiceAccount(t, ctx, c)
	schedStart := time.Now()
	for i := range 4 {
		createGPUPod(t, ctx, c, fmt.Sprintf("gpu-%d", i))
	}
	var bound, pending []string
	var reason string
	cluster.Poll(t, ctx, c.Scheduler, "3 pods bound and 1 unschedulable", time.Minute, func() bool {
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		bound, pending, reason = nil, nil, ""
		for _, p := range pods.Items {
			if p.Spec.NodeName == nodeName {
				bound = append(bound, p.Name)
				continue
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable {
					pending, reason = append(pending, p.Name), cond.Message
				}
			}
		}
		return len(bound) == 3 && len(pending) == 1
	})
	if !strings.Contains(reason, "Insufficient "+gpu) {
		t.Fatalf("pod %s is unschedulable for another reason: %q", pending[0], reason)
	}
	t.Logf("FIGURE scheduler: bound %v to %s, left %s Pending within %s: %q", bound, nodeName, pending[0],
		time.Since(schedStart).Round(time.Millisecond), reason)

	// The device healthy again: allocatable 4, and the scheduler binds the
	// pod it left Pending.
	devs[3].Health = pluginapi.Healthy
	gpus.Update(devs)
	healed := time.Now()
	cluster.Poll(t, ctx, c.Scheduler, pending[0]+" bound", time.Minute, func() bool {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, pending[0], metav1.GetOptions{})
		return err == nil && p.Spec.NodeName == nodeName
	})
	t.Logf("FIGURE device healthy again: %s allocatable 3 -> 4, %s bound %s later", gpu, pending[0], time.Since(healed).Round(time.Millisecond))

	// 5. What the other agent wrote survived every publish of devmgr.
	n := node(t, ctx, c)
	if !has(n, nic, 7, 7) || n.Status.Capacity.Cpu().Value() != 8 || !ready(n) {
		t.Fatalf("the other agent's fields did not survive: capacity %v allocatable %v conditions %v", n.Status.Capacity, n.Status.Allocatable, n.Status.Conditions)
	}
	owned := ownedResources(t, n, "devmgr")
	if want := "capacity:[example.com/gpu] allocatable:[example.com/gpu]"; owned != want {
		t.Fatalf("devmgr owns %q of the status, want %q", owned, want)
	}
	count := publishes(t, devmgr)
	t.Logf("FIGURE other writer: %s=7/7, cpu=8 and Ready=True of field manager %s intact after %d devmgr publishes (%d failed); devmgr owns only %s",
		nic, agent, count.ok, count.failed, owned)

	// 6. An API server outage: the publisher fails, backs off, and
	// publishes what changed meanwhile once the API server is back.
	before := publishes(t, devmgr)
	c.APIServer.Stop()
	devs[0].Health = pluginapi.Unhealthy
	gpus.Update(devs)
	cluster.Poll(t, ctx, devmgr, "a failed publish", 30*time.Second, func() bool { return publishes(t, devmgr).failed > before.failed })
	restart := time.Now()
	c.StartAPIServer(t, "kube-apiserver-restarted")
	back := time.Now()
	took = waitNode(t, ctx, c, devmgr, "gpu 4/3 after the outage", nodestatus.DefaultMaxBackoff+publishBound, func(n *v1.Node) bool { return has(n, gpu, 4, 3) })
	after := publishes(t, devmgr)
	t.Logf("FIGURE API server outage: %d failed publishes while it was down (restart took %s); %s allocatable 4 -> 3 in the node status %s after it was ready again (bound: the %s backoff cap + %s)",
		after.failed-before.failed, back.Sub(restart).Round(time.Millisecond), gpu, took, nodestatus.DefaultMaxBackoff, publishBound)

	// 7. The Node deleted and created anew by someone else while nothing
	// changes on the device side: devmgr notices at its next check.
	old := node(t, ctx, c).UID
	if err := c.Client.CoreV1().Nodes().Delete(ctx, nodeName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	fresh := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, fresh, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err) // AlreadyExists: devmgr (--register-node) was first
	}
	checkBound := nodestatus.DefaultCheckInterval + publishBound
	took = waitNode(t, ctx, c, devmgr, "gpu 4/3 on the new node", checkBound, func(n *v1.Node) bool { return n.UID != old && has(n, gpu, 4, 3) })
	t.Logf("FIGURE node created anew: %s=4/3 back in the status of the new Node %s after it was deleted (bound: the %s check interval + %s)",
		gpu, took, nodestatus.DefaultCheckInterval, publishBound)
	if time.Since(deleted) > checkBound {
		t.Fatalf("devices back %s after the node was deleted, bound %s", time.Since(deleted), checkBound)
	}
	becomeReadyNode(t, ctx, c) // the agent writes its part again

	if code := devmgr.Stop(); code != 0 {
		t.Fatalf("devmgr serve exited %d on SIGTERM", code)
	}
	t.Logf("FIGURE shutdown: devmgr serve exited 0 on SIGTERM")

	// 8. A wipe: devmgr serve on an empty checkpoint directory while the
	// Node still advertises what the first one published. devmgr's own
	// resource is zeroed and removed; the agent's survives.
	n = node(t, ctx, c)
	if !has(n, gpu, 4, 3) || !has(n, nic, 7, 7) {
		t.Fatalf("before the wipe the node advertises capacity %v allocatable %v", n.Status.Capacity, n.Status.Allocatable)
	}
	wipedDir := filepath.Join(dir, "dp-wiped")
	wipeStart := time.Now()
	wiped := cluster.Start(t, dir, "devmgr-wiped", devmgrBin, "serve", "--socket-dir", wipedDir, "--control-socket", filepath.Join(dir, "ctl-wiped.sock"),
		"--numa-nodes", "0", "--stop-grace-period", gracePeriod.String(), "--metrics-address", "127.0.0.1:0",
		"--kubeconfig", c.Kubeconfig, "--node-name", nodeName)
	took = waitNode(t, ctx, c, wiped, "gpu removed after the wipe", time.Minute, func(n *v1.Node) bool {
		_, inCapacity := n.Status.Capacity[gpu]
		_, inAllocatable := n.Status.Allocatable[gpu]
		return !inCapacity && !inAllocatable
	})
	if !regexp.MustCompile(`"Node was wiped: zeroing the extended resources its plugins do not report".* resources=\["` + gpu + `"\]`).MatchString(wiped.Output()) {
		t.Fatalf("devmgr did not log that it zeroes %s alone:\n%s", gpu, wiped.Output())
	}
	if n = node(t, ctx, c); !has(n, nic, 7, 7) {
		t.Fatalf("the agent's %s did not survive the wipe: capacity %v allocatable %v", nic, n.Status.Capacity, n.Status.Allocatable)
	}
	t.Logf("FIGURE wipe: %s zeroed and removed %s after devmgr serve started on an empty checkpoint directory; %s=7/7 of field manager %s intact",
		gpu, took, nic, agent)
	cluster.Poll(t, ctx, wiped, "kubelet.sock", 30*time.Second, func() bool { return exists(filepath.Join(wipedDir, "kubelet.sock")) })
	plugin(t, wipedDir, gpu, 2)
	took = waitNode(t, ctx, c, wiped, "gpu 2/2 after the wipe", publishBound, func(n *v1.Node) bool { return has(n, gpu, 2, 2) })
	t.Logf("FIGURE wipe: %s=2/2 published %s after its plugin registered again (%s after the wiped devmgr serve started)",
		gpu, took, time.Since(wipeStart).Round(time.Millisecond))
	if code := wiped.Stop(); code != 0 {
		t.Fatalf("devmgr serve (wiped) exited %d on SIGTERM", code)
	}
}

// servedNode is a control plane and devmgr serve publishing for nodeName.
type servedNode struct {
	c       *cluster.Cluster
	devmgr  *cluster.Process
	dir     string          // the run's directory
	sockDir string          // serve's socket directory, in the run's directory
	args    []string        // serve's arguments
	ctx     context.Context // the test's 5 minutes
	started time.Time       // when serve started
}

// startServeCluster starts etcd, the API server and the scheduler, and
// devmgr serve publishing for the node nodeName with args added, in a new
// directory removed at the end; it returns once serve's kubelet.sock is
// there.
func startServeCluster(t *testing.T, args ...string) servedNode {
	t.Helper()
	binaries(t)
	dir, err := os.MkdirTemp("", "e2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	c := cluster.StartCluster(t, dir, bins)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	sockDir := filepath.Join(dir, "dp")
	args = append([]string{"serve", "--socket-dir", sockDir,
		"--control-socket", filepath.Join(dir, "ctl.sock"), "--numa-nodes", "0", "--kubeconfig", c.Kubeconfig, "--node-name", nodeName},
		args...)
	if slices.Contains(args, "--dra") {
		// The kubelet's directories, in the run's.
		args = append(args, "--dra-registry-dir", filepath.Join(dir, "registry"),
			"--dra-plugin-dir", filepath.Join(dir, "plugins", dra.DefaultDriverName), "--cdi-dir", filepath.Join(dir, "cdi"))
	}
	sn := servedNode{c: c, dir: dir, sockDir: sockDir, args: args, ctx: ctx}
	sn.startServe(t)
	return sn
}

// startServe starts devmgr serve and returns once its kubelet.sock is
// there.
func (sn *servedNode) startServe(t *testing.T) {
	t.Helper()
	sn.started = time.Now()
	sn.devmgr = cluster.Start(t, sn.dir, "devmgr", devmgrBin, sn.args...)
	cluster.Poll(t, sn.ctx, sn.devmgr, "kubelet.sock", 30*time.Second, func() bool { return exists(filepath.Join(sn.sockDir, "kubelet.sock")) })
}

func plugin(t *testing.T, dir, name string, n int) *plugintest.Plugin {
	t.Helper()
	p, err := plugintest.New(plugintest.Options{ResourceName: name, SocketDir: dir, Devices: devices(strings.TrimPrefix(name, "example.com/"), n)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if err := p.Register(filepath.Join(dir, "kubelet.sock")); err != nil {
		t.Fatal(err)
	}
	return p
}

func devices(prefix string, n int) []*pluginapi.Device {
	out := make([]*pluginapi.Device, n)
	for i := range out {
		out[i] = &pluginapi.Device{ID: fmt.Sprintf("%s-%d", prefix, i), Health: pluginapi.Healthy}
	}
	return out
}

// becomeReadyNode plays the rest of a node agent: it applies a Ready
// condition and the node's cpu, memory, pods and one extended resource of
// its own, and removes the not-ready taint the API server puts on a new
// node (no controller manager runs to remove it).
func becomeReadyNode(t *testing.T, ctx context.Context, c *cluster.Cluster) {
	t.Helper()
	res := v1.ResourceList{v1.ResourceCPU: resource.MustParse("8"), v1.ResourceMemory: resource.MustParse("16Gi"),
		v1.ResourcePods: resource.MustParse("110"), nic: resource.MustParse("7")}
	now := metav1.Now()
	status := corev1ac.Node(nodeName).WithStatus(corev1ac.NodeStatus().WithCapacity(res).WithAllocatable(res).
		WithConditions(corev1ac.NodeCondition().WithType(v1.NodeReady).WithStatus(v1.ConditionTrue).
			WithReason("AgentReady").WithLastHeartbeatTime(now).WithLastTransitionTime(now)))
	if _, err := c.Client.CoreV1().Nodes().ApplyStatus(ctx, status, metav1.ApplyOptions{FieldManager: agent, Force: true}); err != nil {
		t.Fatal(err)
	}
	node, err := c.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Every new Node, --register-node's too, starts with the API server's
	// not-ready taint; docs/SERVE.md tells agents so.
	if !slices.ContainsFunc(node.Spec.Taints, func(tn v1.Taint) bool {
		return tn.Key == v1.TaintNodeNotReady && tn.Effect == v1.TaintEffectNoSchedule
	}) {
		t.Fatalf("the new Node has no %s:NoSchedule taint: %v", v1.TaintNodeNotReady, node.Spec.Taints)
	}
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType, []byte(`{"spec":{"taints":null}}`),
		metav1.PatchOptions{FieldManager: agent}); err != nil {
		t.Fatal(err)
	}
}

func createDefaultServiceAccount(t *testing.T, ctx context.Context, c *cluster.Cluster) {
	t.Helper()
	// No controller manager creates it; the API server's admission wants it.
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "default"}}
	if _, err := c.Client.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func createGPUPod(t *testing.T, ctx context.Context, c *cluster.Cluster, name string) {
	t.Helper()
	one := v1.ResourceList{gpu: resource.MustParse("1")}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.PodSpec{
			AutomountServiceAccountToken: new(false),
			Containers: []v1.Container{{Name: "main", Image: "example.invalid/job",
				Resources: v1.ResourceRequirements{Limits: one, Requests: one}}},
		},
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func node(t *testing.T, ctx context.Context, c *cluster.Cluster) *v1.Node {
	t.Helper()
	n, err := c.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// has reports whether the node advertises capacity and allocatable of name.
func has(n *v1.Node, name v1.ResourceName, capacity, allocatable int64) bool {
	c, okC := n.Status.Capacity[name]
	a, okA := n.Status.Allocatable[name]
	return okC && okA && c.Value() == capacity && a.Value() == allocatable
}

func ready(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// waitNode waits up to limit for the node to satisfy cond and returns how
// long that took.
func waitNode(t *testing.T, ctx context.Context, c *cluster.Cluster, p *cluster.Process, what string, limit time.Duration, cond func(*v1.Node) bool) time.Duration {
	t.Helper()
	start := time.Now()
	cluster.Poll(t, ctx, p, what, limit, func() bool {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		return err == nil && cond(n)
	})
	return time.Since(start).Round(time.Millisecond)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// ownedResources summarizes which status resources the field manager owns.
func ownedResources(t *testing.T, n *v1.Node, manager string) string {
	t.Helper()
	var capacity, allocatable []string
	for _, mf := range n.ManagedFields {
		if mf.Manager != manager || mf.Subresource != "status" || mf.FieldsV1 == nil {
			continue
		}
		raw := mf.FieldsV1.GetRawString()
		capacity = append(capacity, keysUnder(raw, "f:capacity")...)
		allocatable = append(allocatable, keysUnder(raw, "f:allocatable")...)
	}
	return fmt.Sprintf("capacity:%v allocatable:%v", capacity, allocatable)
}

// keysUnder returns the "f:NAME" keys of the object at field in the JSON of
// managed fields.
func keysUnder(raw, field string) []string {
	i := strings.Index(raw, `"`+field+`":{`)
	if i < 0 {
		return nil
	}
	rest := raw[i+len(field)+4:]
	end := strings.Index(rest, "}")
	var out []string
	for _, m := range regexp.MustCompile(`"f:([^"]+)":\{\}`).FindAllStringSubmatch(rest[:end+1], -1) {
		out = append(out, m[1])
	}
	return out
}

// publishCounts are devmgr's publishes by result, from its /metrics.
type publishCounts struct{ ok, failed int }

func publishes(t *testing.T, p *cluster.Process) publishCounts {
	t.Helper()
	m := regexp.MustCompile(`"Serving metrics" address="([^"]+)"`).FindStringSubmatch(p.Output())
	if m == nil {
		t.Fatal("devmgr did not log its metrics address")
	}
	resp, err := http.Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	count := func(result string) int {
		m := regexp.MustCompile(`devmgr_node_status_publishes_total\{result="` + result + `"\} (\d+)`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("no %s publish count on devmgr's /metrics:\n%s", result, b)
		}
		n, err := strconv.Atoi(string(m[1]))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	return publishCounts{ok: count("success"), failed: count("failure")}
}
