package nodee2e

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/e2e/cluster"
)

// node is one kubelet's node during its scenarios: the kubelet, its Node,
// a namespace for its pods, and the two device plugins.
type node struct {
	c      *cluster.Cluster
	k      *kubelet
	ns     string
	dir    string
	sample *samplePlugin
	fpga   *fpgaPlugin
}

// TestDevicePluginsOnARealNode runs the same scenarios, with the same
// assertions, against the stock kubelet and against make kubelet's, one
// node after the other on one containerd, then moves running pods between
// the two kubelets on one node.
func TestDevicePluginsOnARealNode(t *testing.T) {
	c := cluster.StartCluster(t, the.Dir, the.Bins.Binaries,
		// No controller manager runs: nothing would make service accounts
		// or lift the not-ready taint of a new Node.
		"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition")
	rt := startContainerd(t, the.Dir)
	for _, kind := range []string{stockKubelet, devmgrKubelet} {
		t.Run(kind, func(t *testing.T) {
			n := startNode(t, c, rt, kind, kind+"-node")
			scenarios(t, n)
		})
	}
	t.Run("handoff", func(t *testing.T) { handoff(t, c, rt) })
}

// startNode starts a kubelet of kind on a fresh root directory as Node
// name, waits until the Node is Ready, and makes its pods' namespace. When
// the test ends the plugins stop, then the pods are deleted (their
// containers stopped by the kubelet), the kubelet stopped and the Node
// deleted.
func startNode(t *testing.T, c *cluster.Cluster, rt *containerd, kind, name string) *node {
	t.Helper()
	dir := filepath.Join(the.Dir, name)
	freshRoot(t, dir)
	n := &node{c: c, ns: name, dir: dir, k: newKubelet(t, c, rt, kind, name, dir)}
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n.ns}}
	if _, err := c.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if n.k.proc != nil && n.k.proc.Running() { // it stops the pods' containers
			deletePods(t, c, n.k, n.ns)
		}
		for _, p := range n.k.procs {
			p.StopAndReport(t)
		}
		deleteNode(t, c, name)
	})
	n.k.start(t, the.Bins.Kubelets[kind])
	waitNode(t, c, n.k, "Ready", kubeletStartLimit, nodeReady)
	return n
}

// startPlugins starts both device plugins and waits until the Node
// advertises their devices; it returns how long that took per resource.
func (n *node) startPlugins(t *testing.T) (sample, fpga time.Duration) {
	t.Helper()
	n.sample = startSamplePlugin(t, n.dir)
	sample = waitNode(t, n.c, n.k, sampleResource+" 2/2", statusLimit, func(nd *v1.Node) bool { return has(nd, sampleResource, 2, 2) })
	n.fpga = newFPGAPlugin(t, filepath.Join(n.dir, "fpga"), fpgaResource, pluginsDir)
	n.fpga.start(t)
	fpga = waitNode(t, n.c, n.k, fmt.Sprintf("%s %d/%d", fpgaResource, fpgaCount, fpgaCount), statusLimit, func(nd *v1.Node) bool {
		return has(nd, fpgaResource, fpgaCount, fpgaCount)
	})
	return sample, fpga
}

// state is what must not change for a running pod across restarts: its
// containers (runtime IDs, restart counts) and its devices (podresources).
type state struct {
	containers map[string]string
	devices    map[string][]string
}

func (n *node) state(t *testing.T, pod string) state {
	t.Helper()
	return state{containers: containerIDs(getPod(t, n.c, n.ns, pod)), devices: podDevices(t, n.ns, pod)}
}

// requireState fails unless the pod runs with the containers and devices
// of before: the same container IDs, each still a running task in
// containerd (a restarted container would be a new one), restart counts
// unchanged, and the same devices in the kubelet's podresources.
func (n *node) requireState(t *testing.T, pod string, before state) {
	t.Helper()
	p := getPod(t, n.c, n.ns, pod)
	if !running(p) {
		t.Fatalf("pod %s is not running: phase %s %v", pod, p.Status.Phase, p.Status.ContainerStatuses)
	}
	tasks := n.k.runtimes.runningTasks(t)
	for name, id := range before.containers {
		cid, _, _ := strings.Cut(strings.TrimPrefix(id, "containerd://"), " ")
		if !tasks[cid] {
			t.Fatalf("pod %s: container %s (%s) is no longer a running task in containerd", pod, name, cid)
		}
	}
	// A kubelet that has just started lists a pod once its sources gave it.
	cluster.Poll(t, context.Background(), n.k.proc, "pod "+pod+" in the kubelet's podresources", statusLimit, func() bool {
		devs, err := podDevicesErr(n.ns, pod)
		return err == nil && len(devs) > 0
	})
	after := n.state(t, pod)
	if !reflect.DeepEqual(after.containers, before.containers) {
		t.Fatalf("pod %s: containers %v, before %v", pod, after.containers, before.containers)
	}
	if !reflect.DeepEqual(after.devices, before.devices) {
		t.Fatalf("pod %s: devices %v, before %v", pod, after.devices, before.devices)
	}
}

// probeFreeDevices runs a pod asking for one device of each plugin, which
// only the devices the "devices" pod leaves free can serve: the plugins'
// Allocate answers it, so they are back, not only listed. It returns how
// long the pod took to run, and deletes it.
func (n *node) probeFreeDevices(t *testing.T) time.Duration {
	t.Helper()
	_, took := startPod(t, n.c, n.k, devicePod(n.ns, "probe", devices(map[string]int64{sampleResource: 1, fpgaResource: 1})))
	deletePods(t, n.c, n.k, n.ns, "probe")
	return took
}

// waitPluginsBack waits until the kubelet offers every device of both
// plugins again (its podresources API, which a restarted kubelet answers
// from its own state, not the Node's last status) and the Node advertises
// them, and returns how long that took.
func (n *node) waitPluginsBack(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	cluster.Poll(t, context.Background(), n.k.proc, "the kubelet offering every device", statusLimit, func() bool {
		got, err := allocatableCounts() // a kubelet just started may not answer yet
		return err == nil && got[sampleResource] == 2 && got[fpgaResource] == fpgaCount
	})
	waitNode(t, n.c, n.k, "both plugins' devices", statusLimit, func(nd *v1.Node) bool {
		return has(nd, sampleResource, 2, 2) && has(nd, fpgaResource, fpgaCount, fpgaCount)
	})
	return since(start)
}

// restartKubelet stops the kubelet and starts it again; the sample plugin
// registers again by itself, and, with pluginBack, the fpga plugin is
// restarted as a plugin watching kubelet.sock does. It returns when the
// kubelet serves again.
func (n *node) restartKubelet(t *testing.T, pluginBack bool) {
	t.Helper()
	n.k.stop(t)
	n.k.start(t, the.Bins.Kubelets[n.k.kind])
	if pluginBack {
		n.fpga.restart(t)
	}
}

// scenarios runs every scenario on the node, in order: each leaves the
// node as the next expects it.
func scenarios(t *testing.T, n *node) {
	kind := n.k.kind
	step(t, kind, "plugins register: capacity and allocatable in the Node", func(s *scenario) {
		sample, fpga := n.startPlugins(t)
		s.figure(t, "%s 2/2 in %s, %s %d/%d in %s after the plugin started", sampleResource, sample, fpgaResource, fpgaCount, fpgaCount, fpga)
	})

	step(t, kind, "a pod gets its devices: env, mounts, device nodes, CDI edits", func(s *scenario) {
		p, took := startPod(t, n.c, n.k, devicePod(n.ns, "devices", devices(map[string]int64{sampleResource: 1, fpgaResource: 2})))
		s.figure(t, "Running %s after creation", took)
		devs := podDevices(t, n.ns, "devices")["main"]
		fpgaIDs, sampleIDs := idsOf(devs, fpgaResource), idsOf(devs, sampleResource)
		if len(fpgaIDs) != 2 || len(sampleIDs) != 1 {
			t.Fatalf("podresources gives the container %v, want 2 of %s and 1 of %s", devs, fpgaResource, sampleResource)
		}
		got, want := containerReport(t, p, "main"), n.fpga.expectedReport(t, fpgaIDs, sampleIDs)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("the container sees\n%+v\nthe plugins' Allocate answers and CDI specs give\n%+v", got, want)
		}
		s.figure(t, "%d variables, %d mounts, %d device nodes and %d files as allocated", len(got.env), len(got.mounts), len(got.devices), len(got.files))
	})

	step(t, kind, "a pod that does not fit stays Pending (Insufficient)", func(s *scenario) {
		start := time.Now()
		createPod(t, n.c, devicePod(n.ns, "too-big", devices(map[string]int64{sampleResource: 2})))
		p := waitPod(t, n.c, n.k, n.ns, "too-big", "unschedulable", statusLimit, func(p *v1.Pod) bool {
			return slices.ContainsFunc(p.Status.Conditions, func(c v1.PodCondition) bool {
				return c.Type == v1.PodScheduled && c.Reason == v1.PodReasonUnschedulable
			})
		})
		msg := p.Status.Conditions[slices.IndexFunc(p.Status.Conditions, func(c v1.PodCondition) bool { return c.Type == v1.PodScheduled })].Message
		if !strings.Contains(msg, "Insufficient "+sampleResource) || p.Spec.NodeName != "" {
			t.Fatalf("pod too-big on %q: %q, want Pending for Insufficient %s", p.Spec.NodeName, msg, sampleResource)
		}
		s.figure(t, "Pending in %s: %q", since(start), msg)
		deletePod(t, n.c, n.ns, "too-big", 0)
	})

	step(t, kind, "a device turns unhealthy: allocatable drops, the pod runs on, its status says Unhealthy", func(s *scenario) {
		before := n.state(t, "devices")
		sick := idsOf(before.devices["main"], fpgaResource)[0]
		start := time.Now()
		n.fpga.setHealth(sick, pluginapi.Unhealthy)
		took := waitNode(t, n.c, n.k, fpgaResource+" allocatable 2", statusLimit, func(nd *v1.Node) bool {
			return has(nd, fpgaResource, fpgaCount, fpgaCount-1)
		})
		waitPod(t, n.c, n.k, n.ns, "devices", "reported Unhealthy", statusLimit, func(p *v1.Pod) bool {
			return deviceHealth(p, "main", fpgaResource, sick) == v1.ResourceHealthStatusUnhealthy
		})
		s.figure(t, "allocatable %d -> %d in %s, allocatedResourcesStatus Unhealthy in %s", fpgaCount, fpgaCount-1, took, since(start))
		n.requireState(t, "devices", before)
		n.fpga.setHealth(sick, pluginapi.Healthy)
		waitNode(t, n.c, n.k, fpgaResource+" allocatable 3", statusLimit, func(nd *v1.Node) bool { return has(nd, fpgaResource, fpgaCount, fpgaCount) })
		waitPod(t, n.c, n.k, n.ns, "devices", "reported Healthy", statusLimit, func(p *v1.Pod) bool {
			return deviceHealth(p, "main", fpgaResource, sick) == v1.ResourceHealthStatusHealthy
		})
	})

	restart := func(title string, kubeletToo, pluginToo bool) {
		step(t, kind, title, func(s *scenario) {
			before := n.state(t, "devices")
			start := time.Now()
			switch {
			case kubeletToo && pluginToo:
				n.fpga.stop()
				n.sample.proc.Kill()
				n.restartKubelet(t, true)
				n.sample.start(t)
			case kubeletToo:
				n.restartKubelet(t, true)
			default:
				n.fpga.restart(t)
				n.sample.restart(t)
			}
			n.waitPluginsBack(t)
			back := since(start)
			n.requireState(t, "devices", before)
			took := n.probeFreeDevices(t)
			s.figure(t, "every device offered again %s after the restart began; containers and devices unchanged; a pod of the free devices Running in %s",
				back, took)
		})
	}
	restart("kubelet restart: running pods keep their devices, no container restarts", true, false)
	restart("plugin restart: running pods keep their devices, no container restarts", false, true)
	restart("kubelet and plugins restart: running pods keep their devices, no container restarts", true, true)

	step(t, kind, "a container restarts: it keeps its devices", func(s *scenario) {
		// The container fails once (a file in its emptyDir says so), and
		// the kubelet starts it again in the same pod.
		pod := devicePod(n.ns, "restarts", devices(map[string]int64{fpgaResource: 1}))
		pod.Spec.RestartPolicy = v1.RestartPolicyOnFailure
		pod.Spec.Volumes = []v1.Volume{{Name: "state", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
		c := &pod.Spec.Containers[0]
		c.VolumeMounts = []v1.VolumeMount{{Name: "state", MountPath: "/state"}}
		c.Command = []string{"sh", "-c", reportScript + `[ -e /state/once ] || { touch /state/once; exit 1; }
` + waitScript}
		start := time.Now()
		createPod(t, n.c, pod)
		p := waitPod(t, n.c, n.k, n.ns, "restarts", "Running after a restart", podStartLimit, func(p *v1.Pod) bool {
			return running(p) && p.Status.ContainerStatuses[0].RestartCount >= 1
		})
		ids := idsOf(podDevices(t, n.ns, "restarts")["main"], fpgaResource)
		if len(ids) != 1 {
			t.Fatalf("podresources gives pod restarts %v, want one %s", ids, fpgaResource)
		}
		if got, want := containerReport(t, p, "main"), n.fpga.expectedReport(t, ids, nil); !reflect.DeepEqual(got, want) {
			t.Fatalf("the restarted container sees\n%+v\nits Allocate answer gives\n%+v", got, want)
		}
		s.figure(t, "restarted and Running %s after creation with the same %s", since(start), ids[0])
		deletePods(t, n.c, n.k, n.ns, "restarts")
	})

	step(t, kind, "plugin not back after a kubelet restart: a new pod fails admission, a finished one stays finished", func(s *scenario) {
		before := n.state(t, "devices")
		done := devicePod(n.ns, "done", devices(map[string]int64{fpgaResource: 1}))
		done.Spec.Containers[0] = containerSpec("main", false, devices(map[string]int64{fpgaResource: 1}))
		createPod(t, n.c, done)
		waitPod(t, n.c, n.k, n.ns, "done", "Succeeded", podStartLimit, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
		n.fpga.stop()
		n.restartKubelet(t, false)
		pod := devicePod(n.ns, "early", devices(map[string]int64{fpgaResource: 1}))
		pod.Spec.NodeName = n.k.node // past the scheduler, as a pod bound before the restart
		start := time.Now()
		createPod(t, n.c, pod)
		p := waitPod(t, n.c, n.k, n.ns, "early", "Failed", podStartLimit, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
		if p.Status.Reason != "UnexpectedAdmissionError" {
			t.Fatalf("pod early failed with reason %q (%q), want UnexpectedAdmissionError", p.Status.Reason, p.Status.Message)
		}
		s.figure(t, "Failed in %s: %s: %q", since(start), p.Status.Reason, p.Status.Message)
		// The kubelet has synced pods since it started: the pod that ran
		// to completion before was not admitted again.
		if got := getPod(t, n.c, n.ns, "done"); got.Status.Phase != v1.PodSucceeded {
			t.Fatalf("pod done is %s after the kubelet restart (%q), want it Succeeded still", got.Status.Phase, got.Status.Message)
		}
		n.fpga.start(t)
		n.waitPluginsBack(t)
		n.requireState(t, "devices", before)
		deletePods(t, n.c, n.k, n.ns, "early", "done")
	})

	step(t, kind, "a pod deleted while the kubelet is down: its devices are freed when it is back", func(s *scenario) {
		n.k.stop(t)
		deletePod(t, n.c, n.ns, "devices", 0)
		start := time.Now()
		n.k.start(t, the.Bins.Kubelets[n.k.kind])
		n.fpga.restart(t)
		n.waitPluginsBack(t)
		took := since(start)
		_, running := startPod(t, n.c, n.k, devicePod(n.ns, "all", devices(map[string]int64{sampleResource: 2, fpgaResource: fpgaCount})))
		devs := podDevices(t, n.ns, "all")["main"]
		if len(idsOf(devs, sampleResource)) != 2 || len(idsOf(devs, fpgaResource)) != fpgaCount {
			t.Fatalf("pod all holds %v, want every device", devs)
		}
		s.figure(t, "every device allocatable %s after the kubelet started again; a pod of all of them Running %s later", took, running)
		deletePods(t, n.c, n.k, n.ns)
	})

	step(t, kind, "init container, sidecar and app container get the devices the kubelet gives them", func(s *scenario) {
		one := devices(map[string]int64{fpgaResource: 1})
		always := v1.ContainerRestartPolicyAlways
		sidecar := containerSpec("sidecar", true, one)
		sidecar.RestartPolicy = &always
		pod := devicePod(n.ns, "phases", one)
		pod.Spec.InitContainers = []v1.Container{containerSpec("init", false, one), sidecar}
		p, took := startPod(t, n.c, n.k, pod)
		devs := podDevices(t, n.ns, "phases")
		held := map[string][]string{}
		for _, name := range []string{"init", "sidecar", "main"} {
			r := containerReport(t, p, name)
			ids := fpgaIDsOf(r)
			if len(ids) != 1 {
				t.Fatalf("container %s sees %s devices %v, want one", name, fpgaResource, ids)
			}
			if name != "init" && !slices.Equal(ids, idsOf(devs[name], fpgaResource)) {
				t.Fatalf("container %s sees %v, podresources gives it %v", name, ids, devs[name])
			}
			if want := n.fpga.expectedReport(t, ids, nil); !reflect.DeepEqual(r, want) {
				t.Fatalf("container %s sees\n%+v\nits Allocate answer gives\n%+v", name, r, want)
			}
			held[name] = ids
		}
		if slices.Equal(held["sidecar"], held["main"]) {
			t.Fatalf("the sidecar and the app container, running together, share %v", held["main"])
		}
		pattern := devicePattern(held)
		if kind == devmgrKubelet {
			if stockPattern == "" {
				t.Fatalf("devices by container %s; the stock kubelet's are unknown (its run failed before), nothing to compare with", pattern)
			}
			if pattern != stockPattern {
				t.Fatalf("devices by container %s, the stock kubelet gave %s", pattern, stockPattern)
			}
		}
		if kind == stockKubelet {
			stockPattern = pattern
		}
		s.figure(t, "Running in %s; devices by container: %s", took, pattern)
	})

	claimScenario(t, n)
}

// stockPattern is how the stock kubelet shared devices among the init,
// sidecar and app containers, for the devmgr kubelet to match.
var stockPattern string

// devicePattern names each container's devices by the order they first
// appear ("init=A sidecar=A main=B"), so that two kubelets choosing other
// IDs compare equal when they share devices alike.
func devicePattern(held map[string][]string) string {
	letters := map[string]string{}
	var parts []string
	for _, name := range []string{"init", "sidecar", "main"} {
		var ls []string
		for _, id := range held[name] {
			if letters[id] == "" {
				letters[id] = string(rune('A' + len(letters)))
			}
			ls = append(ls, letters[id])
		}
		parts = append(parts, name+"="+strings.Join(ls, ","))
	}
	return strings.Join(parts, " ")
}

// fpgaIDsOf reads the fpga devices a container reported from its
// FPGA_DEVICES variable.
func fpgaIDsOf(r report) []string {
	for _, e := range r.env {
		if v, ok := strings.CutPrefix(e, "FPGA_DEVICES="); ok {
			return strings.Split(v, ",")
		}
	}
	return nil
}

// deviceHealth is the health the pod status reports for a device of a
// container, "" if none.
func deviceHealth(p *v1.Pod, container, resource, id string) v1.ResourceHealthStatus {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != container {
			continue
		}
		for _, rs := range cs.AllocatedResourcesStatus {
			if string(rs.Name) != resource {
				continue
			}
			for _, h := range rs.Resources {
				if string(h.ResourceID) == id {
					return h.Health
				}
			}
		}
	}
	return ""
}

// handoff moves a node with running pods from the stock kubelet to
// devmgr's and back, on one root directory: each kubelet takes over the
// other's checkpoint. No container restarts, no device changes owner, and a
// new pod gets only a device nobody holds.
func handoff(t *testing.T, c *cluster.Cluster, rt *containerd) {
	n := startNode(t, c, rt, stockKubelet, "handoff-node")
	n.startPlugins(t)
	startPod(t, c, n.k, devicePod(n.ns, "a", devices(map[string]int64{sampleResource: 1, fpgaResource: 1})))
	startPod(t, c, n.k, devicePod(n.ns, "b", devices(map[string]int64{fpgaResource: 1})))
	pods := []string{"a", "b"}
	states := map[string]state{}
	for _, p := range pods {
		states[p] = n.state(t, p)
	}
	held := func() []string {
		var ids []string
		for _, p := range pods {
			ids = append(ids, idsOf(states[p].devices["main"], fpgaResource)...)
		}
		return ids
	}

	// takeOver stops the running kubelet and starts one of kind on the
	// same node; the fpga plugin registers again as it would on the new
	// kubelet.sock.
	takeOver := func(s *scenario, kind string) {
		t.Helper()
		from := n.k.kind
		start := time.Now()
		n.k.stop(t)
		n.k.kind = kind
		n.k.start(t, the.Bins.Kubelets[kind])
		n.fpga.restart(t)
		n.waitPluginsBack(t)
		for _, p := range pods {
			n.requireState(t, p, states[p])
		}
		s.figure(t, "from the %s kubelet: every device offered again %s after the handoff began; %d running pods kept containers and devices",
			from, since(start), len(pods))
	}

	const title = "handoff with running pods: no restart, no device changes owner, new pods get free devices"
	step(t, devmgrKubelet, title, func(s *scenario) {
		takeOver(s, devmgrKubelet)
		startPod(t, c, n.k, devicePod(n.ns, "c", devices(map[string]int64{fpgaResource: 1})))
		got := idsOf(podDevices(t, n.ns, "c")["main"], fpgaResource)
		if len(got) != 1 || slices.Contains(held(), got[0]) {
			t.Fatalf("new pod c got %v; %v are held by pods a and b", got, held())
		}
		pods = append(pods, "c")
		states["c"] = n.state(t, "c")
	})
	step(t, stockKubelet, title, func(s *scenario) {
		takeOver(s, stockKubelet)
		// Every fpga device is held: a new pod asking for one waits.
		createPod(t, c, devicePod(n.ns, "d", devices(map[string]int64{fpgaResource: 1})))
		waitPod(t, c, n.k, n.ns, "d", "unschedulable", statusLimit, func(p *v1.Pod) bool {
			return slices.ContainsFunc(p.Status.Conditions, func(c v1.PodCondition) bool {
				return c.Type == v1.PodScheduled && c.Reason == v1.PodReasonUnschedulable && strings.Contains(c.Message, "Insufficient "+fpgaResource)
			})
		})
		// Bound past the scheduler, the kubelet itself refuses it: it
		// counts the devices the pods it took over hold.
		bound := devicePod(n.ns, "d-bound", devices(map[string]int64{fpgaResource: 1}))
		bound.Spec.NodeName = n.k.node
		createPod(t, c, bound)
		p := waitPod(t, c, n.k, n.ns, "d-bound", "Failed", podStartLimit, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
		s.figure(t, "a pod bound to the node for a held device refused: %s: %q", p.Status.Reason, p.Status.Message)
		// A free sample device goes to a new pod, not pod a's.
		startPod(t, c, n.k, devicePod(n.ns, "e", devices(map[string]int64{sampleResource: 1})))
		got := idsOf(podDevices(t, n.ns, "e")["main"], sampleResource)
		if len(got) != 1 || slices.Contains(idsOf(states["a"].devices["main"], sampleResource), got[0]) {
			t.Fatalf("new pod e got %v; pod a holds %v", got, states["a"].devices["main"])
		}
	})
}
