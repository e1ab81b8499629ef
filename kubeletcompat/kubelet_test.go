package kubeletcompat_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	kubeletdm "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/kubeletcompat"
)

// machine is the node of the comparisons: two NUMA nodes with two devices
// each.
var machine = []int{0, 1}

// machineNodes describes the machine as cadvisor does, for the kubelet.
func machineNodes() []cadvisorapi.Node {
	nodes := make([]cadvisorapi.Node, len(machine))
	for i, id := range machine {
		nodes[i] = cadvisorapi.Node{Id: id}
	}
	return nodes
}

// topologyManager is the kubelet's topology manager on the machine.
func topologyManager(t *testing.T, policy, scope string) topologymanager.Manager {
	t.Helper()
	tm, err := topologymanager.NewManager(testLogger(t), machineNodes(), policy, scope, nil)
	require.NoError(t, err)
	return tm
}

// side is one of the two device managers under the kubelet's topology
// manager.
type side struct {
	name string
	// start returns a started manager whose checkpoint and kubelet.sock are
	// in the returned directory.
	start func(t *testing.T, store topologymanager.Store, active *pods) (kubeletdm.Manager, string)
}

var kubeletSide = side{name: "kubelet", start: startKubelet}

var adapterSide = side{name: "kubeletcompat", start: func(t *testing.T, store topologymanager.Store, active *pods) (kubeletdm.Manager, string) {
	dir := shortDir(t)
	return startAdapter(t, dir, store, active), dir
}}

// startKubelet starts the kubelet's own device manager, v1.37.2, in the
// fixed directory, which TestMain made the test's own.
func startKubelet(t *testing.T, store topologymanager.Store, active *pods) (kubeletdm.Manager, string) {
	t.Helper()
	needKubelet(t)
	log := testLogger(t)
	m, err := kubeletdm.NewManagerImpl(log, machineNodes(), store)
	require.NoError(t, err)
	require.NoError(t, m.Start(log, active.get, ready{}, containermap.NewContainerMap(), sets.New[string]()))
	t.Cleanup(func() { require.NoError(t, m.Stop(log)) })
	return m, pluginapi.DevicePluginPath
}

// startAdapter starts the adapter on dir.
func startAdapter(t *testing.T, dir string, store topologymanager.Store, active *pods) *kubeletcompat.Manager {
	t.Helper()
	m, err := kubeletcompat.New(devicemanager.Options{SocketDir: dir, NUMANodes: machine, Logger: testLogger(t)}, store)
	require.NoError(t, err)
	require.NoError(t, m.Start(logger, active.get, ready{}, containermap.NewContainerMap(), sets.New[string]()))
	t.Cleanup(func() { require.NoError(t, m.Stop(logger)) })
	return m
}

// emptyKubeletDir removes what an earlier test left in the kubelet's
// directory (on the namespace's tmpfs).
func emptyKubeletDir(t *testing.T) {
	t.Helper()
	needKubelet(t)
	entries, err := os.ReadDir(pluginapi.DevicePluginPath)
	require.NoError(t, err)
	for _, e := range entries {
		require.NoError(t, os.RemoveAll(filepath.Join(pluginapi.DevicePluginPath, e.Name())))
	}
}

// step admits a pod, or ends one (the pod leaves the active pods).
type step struct {
	admit *v1.Pod
	end   string
}

// outcome is what a step did: the admit decision and, per container, the
// affinity the topology manager chose and the NUMA nodes of its devices.
type outcome struct {
	Pod        string
	Admit      bool
	Reason     string
	Containers []string
}

func (o outcome) String() string {
	return fmt.Sprintf("%s admit=%v %s %v", o.Pod, o.Admit, o.Reason, o.Containers)
}

// scenario is the pods of the comparison, on four devices (two per node).
func scenario() []step {
	restartable := v1.ContainerRestartPolicyAlways
	sidecar := container("sidecar", 1)
	sidecar.RestartPolicy = &restartable
	return []step{
		{admit: newPod("one", nil, container("app", 1))},
		{admit: newPod("three", nil, container("app", 3))},
		{admit: newPod("pair", nil, container("a", 1), container("b", 1))},
		{end: "three"},
		{admit: newPod("init", []v1.Container{container("init", 2)}, container("app", 1))},
		{end: "one"},
		{end: "pair"},
		{admit: newPod("halves", nil, container("a", 2), container("b", 2))},
		{end: "init"},
		{end: "halves"},
		{admit: newPod("sidecar", []v1.Container{sidecar}, container("app", 1))},
		{admit: newPod("two", nil, container("app", 2))},
		{admit: newPod("more", nil, container("app", 2))},
		{end: "two"},
		{admit: newPod("single", nil, container("app", 1))},
		{end: "sidecar"},
		{admit: newPod("single2", nil, container("app", 1))},
		{admit: newPod("spread", nil, container("app", 2))},
	}
}

// run drives the kubelet's topology manager with policy and scope and one
// side's device manager as its hint provider, through the scenario.
func run(t *testing.T, s side, policy, scope string) []outcome {
	t.Helper()
	if s.name == kubeletSide.name {
		emptyKubeletDir(t)
	}
	tm := topologyManager(t, policy, scope)
	active := &pods{}
	dm, dir := s.start(t, tm, active)
	tm.AddHintProvider(logger, dm)
	startPlugin(t, dir, numaDevices(machine, 2))
	waitAllocatable(t, dm, 4)

	ctx := klog.NewContext(context.Background(), testLogger(t))
	var out []outcome
	for _, st := range scenario() {
		if st.end != "" {
			active.remove(st.end)
			continue
		}
		pod := st.admit
		active.add(pod)
		res := tm.Admit(ctx, &lifecycle.PodAdmitAttributes{Pod: pod, Operation: lifecycle.AddOperation})
		o := outcome{Pod: pod.Name, Admit: res.Admit, Reason: res.Reason}
		if !res.Admit {
			active.remove(string(pod.UID))
		} else {
			for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
				o.Containers = append(o.Containers, placement(tm, dm, pod, c.Name))
			}
		}
		out = append(out, o)
	}
	return out
}

// placement describes one container's alignment: the affinity, and the
// NUMA node of each of its devices, sorted.
func placement(tm topologymanager.Manager, dm kubeletdm.Manager, pod *v1.Pod, name string) string {
	var numa []string
	for _, d := range dm.GetDevices(string(pod.UID), name)[gpu] {
		for _, n := range d.GetTopology().GetNodes() {
			numa = append(numa, fmt.Sprint(n.ID))
		}
	}
	slices.Sort(numa)
	affinity := "none"
	if a := tm.GetAffinity(logger, string(pod.UID), name).NUMANodeAffinity; a != nil {
		affinity = fmt.Sprint(a.GetBits())
	}
	return fmt.Sprintf("%s: affinity %s devices on [%s]", name, affinity, strings.Join(numa, " "))
}

func TestSameAdmissionAndAlignmentAsTheKubelet(t *testing.T) {
	needKubelet(t)
	var admitted, refused int
	for _, policy := range []string{topologymanager.PolicyBestEffort, topologymanager.PolicyRestricted, topologymanager.PolicySingleNumaNode} {
		for _, scope := range []string{topologymanager.ContainerTopologyScope, topologymanager.PodTopologyScope} {
			t.Run(policy+"/"+scope, func(t *testing.T) {
				want := run(t, kubeletSide, policy, scope)
				got := run(t, adapterSide, policy, scope)
				assert.Equal(t, want, got)
				for _, o := range got {
					if o.Admit {
						admitted++
					} else {
						refused++
					}
				}
			})
		}
	}
	assert.NotZero(t, admitted, "the scenario admits pods")
	assert.NotZero(t, refused, "the scenario refuses pods")
}

// held is what a manager reports for one container: its devices and its
// runtime settings.
type held struct {
	Devices kubeletdm.ResourceDeviceInstances
	Run     *kubeletdm.DeviceRunContainerOptions
}

// snapshot reads what m reports for every container of pods.
func snapshot(t *testing.T, m kubeletdm.Manager, pods ...*v1.Pod) map[string]held {
	t.Helper()
	out := map[string]held{}
	for _, pod := range pods {
		for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
			run, err := m.GetDeviceRunContainerOptions(context.Background(), pod, &c)
			require.NoError(t, err)
			out[string(pod.UID)+"/"+c.Name] = held{Devices: m.GetDevices(string(pod.UID), c.Name), Run: run}
		}
	}
	return out
}

// startIn starts one side's manager in the kubelet's directory.
func startIn(t *testing.T, s side, store topologymanager.Store, active *pods) kubeletdm.Manager {
	t.Helper()
	if s.name == kubeletSide.name {
		m, _ := startKubelet(t, store, active)
		return m
	}
	return startAdapter(t, pluginapi.DevicePluginPath, store, active)
}

// moveNode admits pods under one side, stops it, and starts the other on
// the checkpoint it left: the other must report the same devices and
// settings for every container, and hand out only the device left free.
func moveNode(t *testing.T, from, to side) {
	needKubelet(t)
	emptyKubeletDir(t)
	tm := topologyManager(t, topologymanager.PolicyBestEffort, topologymanager.ContainerTopologyScope)
	active := &pods{}
	first := startIn(t, from, tm, active)
	tm.AddHintProvider(logger, first)
	p := startPlugin(t, pluginapi.DevicePluginPath, numaDevices(machine, 2))
	waitAllocatable(t, first, 4)

	ctx := klog.NewContext(context.Background(), testLogger(t))
	a := newPod("a", []v1.Container{container("init", 2)}, container("app", 1), container("plain", 0))
	b := newPod("b", nil, container("app", 1))
	for _, pod := range []*v1.Pod{a, b} {
		active.add(pod)
		res := tm.Admit(ctx, &lifecycle.PodAdmitAttributes{Pod: pod, Operation: lifecycle.AddOperation})
		require.True(t, res.Admit, "%s under %s: %s", pod.Name, from.name, res.Message)
	}
	before := snapshot(t, first, a, b)
	require.Len(t, before["a/init"].Devices[gpu], 2)
	require.Len(t, before["b/app"].Devices[gpu], 1)
	p.Stop()
	require.NoError(t, first.Stop(logger))

	tm = topologyManager(t, topologymanager.PolicyBestEffort, topologymanager.ContainerTopologyScope)
	second := startIn(t, to, tm, active)
	tm.AddHintProvider(logger, second)
	assert.Equal(t, before, snapshot(t, second, a, b), "%s reads what %s wrote", to.name, from.name)

	startPlugin(t, pluginapi.DevicePluginPath, numaDevices(machine, 2))
	waitAllocatable(t, second, 4)
	inUse := sets.New[string]()
	for _, h := range before {
		inUse.Insert(slices.Collect(maps.Keys(h.Devices[gpu]))...)
	}
	c := newPod("c", nil, container("app", 1))
	active.add(c)
	require.True(t, tm.Admit(ctx, &lifecycle.PodAdmitAttributes{Pod: c, Operation: lifecycle.AddOperation}).Admit)
	got := slices.Collect(maps.Keys(second.GetDevices("c", "app")[gpu]))
	require.Len(t, got, 1)
	assert.False(t, inUse.Has(got[0]), "%s handed out %s, which a pod of %s holds", to.name, got[0], from.name)

	d := newPod("d", nil, container("app", 1))
	active.add(d)
	assert.False(t, tm.Admit(ctx, &lifecycle.PodAdmitAttributes{Pod: d, Operation: lifecycle.AddOperation}).Admit,
		"every device is held")
}

func TestNodeMovesFromTheKubeletToTheAdapter(t *testing.T) { moveNode(t, kubeletSide, adapterSide) }

func TestNodeMovesFromTheAdapterToTheKubelet(t *testing.T) { moveNode(t, adapterSide, kubeletSide) }
