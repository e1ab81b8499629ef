package nodee2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/openkubelet/devmgr/e2e/cluster"
)

// Limits of the waits: a pod's containers start within podStartLimit, and a
// change the kubelet reports reaches the API server within statusLimit.
const (
	podStartLimit = 2 * time.Minute
	statusLimit   = time.Minute
)

// reportScript is what every test container runs: it prints, one line each,
// the device environment it sees (the plugins' and their CDI specs'
// variables), the contents of the plugins' mounts and whether each is
// read-only (the first option /proc/mounts gives it), and the device nodes
// and files they put in it, then "done"; an app container then waits for
// SIGTERM.
const reportScript = `env | grep -E '^(FPGA|CDI)_' | sort | sed 's/^/env /'
for d in /fpga/*/; do [ -e "$d/id" ] && echo "mount $d $(cat $d/id) $(grep " ${d%/} " /proc/mounts | cut -d' ' -f4 | cut -d, -f1)"; done
for f in /dev/fpga-*; do [ -e "$f" ] && echo "device $f $(stat -c '%F %t:%T' $f)"; done
for f in /tmp/Dev-* /tmp/CDI-*; do [ -e "$f" ] && echo "file $f $(stat -c '%F' $f)"; done
echo done
`

// waitScript keeps an app container running until SIGTERM.
const waitScript = `trap 'exit 0' TERM; sleep 1000000 & wait`

// containerSpec is a busybox container that reports its devices and, unless
// it is a regular init container, keeps running.
func containerSpec(name string, keepRunning bool, requests v1.ResourceList) v1.Container {
	script := reportScript
	if keepRunning {
		script += waitScript
	}
	return v1.Container{Name: name, Image: busyboxImage, ImagePullPolicy: v1.PullNever,
		Command:   []string{"sh", "-c", script},
		Resources: v1.ResourceRequirements{Limits: requests, Requests: requests}}
}

// devicePod is a pod of one running container requesting the devices.
func devicePod(ns, name string, requests v1.ResourceList) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.PodSpec{
			AutomountServiceAccountToken:  new(false),
			TerminationGracePeriodSeconds: new(int64(5)),
			RestartPolicy:                 v1.RestartPolicyNever,
			Containers:                    []v1.Container{containerSpec("main", true, requests)},
		},
	}
}

// devices is a resource list of n devices of each resource named.
func devices(counts map[string]int64) v1.ResourceList {
	out := v1.ResourceList{}
	for name, n := range counts {
		out[v1.ResourceName(name)] = *resource.NewQuantity(n, resource.DecimalSI)
	}
	return out
}

func createPod(t *testing.T, c *cluster.Cluster, pod *v1.Pod) *v1.Pod {
	t.Helper()
	p, err := c.Client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	return p
}

func getPod(t *testing.T, c *cluster.Cluster, ns, name string) *v1.Pod {
	t.Helper()
	p, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s: %v", name, err)
	}
	return p
}

// waitPod waits up to limit for the pod to satisfy cond, failing early if
// the kubelet exits, and returns the pod.
func waitPod(t *testing.T, c *cluster.Cluster, k *kubelet, ns, name, what string, limit time.Duration, cond func(*v1.Pod) bool) *v1.Pod {
	t.Helper()
	var last *v1.Pod
	err := cluster.PollErr(context.Background(), k.proc, limit, func() bool {
		p, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = p
		return cond(p)
	})
	if err != nil {
		status := "not found"
		if last != nil {
			status = fmt.Sprintf("phase %s, reason %q, message %q, conditions %v, containers %v",
				last.Status.Phase, last.Status.Reason, last.Status.Message, last.Status.Conditions, last.Status.ContainerStatuses)
		}
		t.Fatalf("waiting %s for pod %s to be %s: %v; %s", limit, name, what, err, status)
	}
	return last
}

// running reports whether every container of the pod runs and is started.
func running(p *v1.Pod) bool {
	if p.Status.Phase != v1.PodRunning {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running == nil {
			return false
		}
	}
	return len(p.Status.ContainerStatuses) == len(p.Spec.Containers)
}

// startPod creates the pod, waits until it runs, and returns it with the
// time that took.
func startPod(t *testing.T, c *cluster.Cluster, k *kubelet, pod *v1.Pod) (*v1.Pod, time.Duration) {
	t.Helper()
	start := time.Now()
	createPod(t, c, pod)
	p := waitPod(t, c, k, pod.Namespace, pod.Name, "Running", podStartLimit, running)
	return p, since(start)
}

// deletePods deletes the named pods of the namespace, every one when none
// is named, and waits until they are gone: the kubelet has stopped their
// containers.
func deletePods(t *testing.T, c *cluster.Cluster, k *kubelet, ns string, names ...string) {
	t.Helper()
	ctx := context.Background()
	if len(names) == 0 {
		if err := c.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		if err := c.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cluster.Poll(t, ctx, k.proc, fmt.Sprintf("the pods %v of %s gone", names, ns), podStartLimit, func() bool {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, p := range pods.Items {
			if len(names) == 0 || slices.Contains(names, p.Name) {
				return false
			}
		}
		return true
	})
}

func deletePod(t *testing.T, c *cluster.Cluster, ns, name string, grace int64) {
	t.Helper()
	err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// containerIDs are the pod's containers' runtime IDs and restart counts,
// by container name.
func containerIDs(p *v1.Pod) map[string]string {
	out := map[string]string{}
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		out[cs.Name] = fmt.Sprintf("%s restarts=%d", cs.ContainerID, cs.RestartCount)
	}
	return out
}

// waitNode waits up to limit for the Node to satisfy cond and returns how
// long that took.
func waitNode(t *testing.T, c *cluster.Cluster, k *kubelet, what string, limit time.Duration, cond func(*v1.Node) bool) time.Duration {
	t.Helper()
	start := time.Now()
	var last *v1.Node
	err := cluster.PollErr(context.Background(), k.proc, limit, func() bool {
		n, err := c.Client.CoreV1().Nodes().Get(context.Background(), k.node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = n
		return cond(n)
	})
	if err != nil {
		got := "no Node"
		if last != nil {
			got = fmt.Sprintf("capacity %v allocatable %v", last.Status.Capacity, last.Status.Allocatable)
		}
		t.Fatalf("waiting %s for node %s: %s: %v; %s", limit, k.node, what, err, got)
	}
	return since(start)
}

// has reports whether the node advertises capacity and allocatable of
// name.
func has(n *v1.Node, name string, capacity, allocatable int64) bool {
	c, okC := n.Status.Capacity[v1.ResourceName(name)]
	a, okA := n.Status.Allocatable[v1.ResourceName(name)]
	return okC && okA && c.Value() == capacity && a.Value() == allocatable
}

func nodeReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// report is what a container printed of its devices.
type report struct {
	env     []string // NAME=value
	mounts  []string // "/fpga/ID/ ID ro"
	devices []string // "/dev/fpga-N character special file 1:3"
	files   []string // "/tmp/Dev-1 regular empty file"
}

// containerReport reads the report the container printed, from its log in
// the kubelet's pod log directory, waiting until it is complete.
func containerReport(t *testing.T, p *v1.Pod, container string) report {
	t.Helper()
	pattern := filepath.Join("/var/log/pods", fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), container, "*.log")
	var r report
	var done bool
	err := cluster.PollErr(context.Background(), nil, statusLimit, func() bool {
		logs, _ := filepath.Glob(pattern)
		if len(logs) == 0 {
			return false
		}
		slices.Sort(logs)
		r, done = parseReport(logs[len(logs)-1])
		return done
	})
	if err != nil {
		t.Fatalf("no complete report from %s/%s in %s: %v", p.Name, container, pattern, err)
	}
	return r
}

// parseReport reads a CRI log file ("TIME STREAM TAG LINE" per line).
func parseReport(path string) (report, bool) {
	var r report
	f, err := os.Open(path)
	if err != nil {
		return r, false
	}
	defer f.Close()
	for sc := bufio.NewScanner(f); sc.Scan(); {
		fields := strings.SplitN(sc.Text(), " ", 4)
		if len(fields) < 4 {
			continue
		}
		kind, rest, _ := strings.Cut(fields[3], " ")
		switch kind {
		case "env":
			r.env = append(r.env, rest)
		case "mount":
			r.mounts = append(r.mounts, rest)
		case "device":
			r.devices = append(r.devices, rest)
		case "file":
			r.files = append(r.files, rest)
		case "done":
			for _, l := range [][]string{r.env, r.mounts, r.devices, r.files} {
				slices.Sort(l)
			}
			return r, true
		}
	}
	return r, false
}

// podResources calls the kubelet's podresources API on its socket.
func podResources[T any](call func(context.Context, podresourcesapi.PodResourcesListerClient) (T, error)) (T, error) {
	var zero T
	conn, err := grpc.NewClient("unix://"+podResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return zero, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return call(ctx, podresourcesapi.NewPodResourcesListerClient(conn))
}

// allocatableCounts is how many devices of each resource the kubelet
// itself offers, healthy and registered (podresources
// GetAllocatableResources).
func allocatableCounts() (map[string]int, error) {
	resp, err := podResources(func(ctx context.Context, c podresourcesapi.PodResourcesListerClient) (*podresourcesapi.AllocatableResourcesResponse, error) {
		return c.GetAllocatableResources(ctx, &podresourcesapi.AllocatableResourcesRequest{})
	})
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, d := range resp.GetDevices() {
		out[d.GetResourceName()] += len(d.GetDeviceIds())
	}
	return out, nil
}

// podDevices returns, from the kubelet's podresources API, the devices of
// each container of the pod as "resource=id,id" sorted, by container.
func podDevices(t *testing.T, ns, name string) map[string][]string {
	t.Helper()
	out, err := podDevicesErr(ns, name)
	if err != nil {
		t.Fatalf("podresources List: %v", err)
	}
	return out
}

func podDevicesErr(ns, name string) (map[string][]string, error) {
	resp, err := podResources(func(ctx context.Context, c podresourcesapi.PodResourcesListerClient) (*podresourcesapi.ListPodResourcesResponse, error) {
		return c.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	})
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, p := range resp.GetPodResources() {
		if p.GetNamespace() != ns || p.GetName() != name {
			continue
		}
		for _, c := range p.GetContainers() {
			// A resource's devices come in one entry per NUMA placement.
			byResource := map[string][]string{}
			for _, d := range c.GetDevices() {
				byResource[d.GetResourceName()] = append(byResource[d.GetResourceName()], d.GetDeviceIds()...)
			}
			var devs []string
			for r, ids := range byResource {
				slices.Sort(ids)
				devs = append(devs, r+"="+strings.Join(ids, ","))
			}
			slices.Sort(devs)
			out[c.GetName()] = devs
		}
	}
	return out, nil
}

// idsOf returns the device IDs of resource in a podDevices entry.
func idsOf(devs []string, resource string) []string {
	for _, d := range devs {
		if ids, ok := strings.CutPrefix(d, resource+"="); ok && ids != "" {
			return strings.Split(ids, ",")
		}
	}
	return nil
}
