package kubeletcompat_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/go-logr/logr"
	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/kubeletcompat"
	"github.com/openkubelet/devmgr/plugintest"
)

// allSourcesReady is the kubelet's config.SourcesReady once every pod source
// has been seen.
type allSourcesReady struct{}

func (allSourcesReady) AddSource(string) {}
func (allSourcesReady) AllReady() bool   { return true }

// Swapping devmgr in for the kubelet's device manager: where the kubelet's
// container manager makes its device manager, it makes the adapter instead,
// hands it the topology manager as its store and registers it as a hint
// provider. The topology manager's admission then allocates through devmgr.
func ExampleNew() {
	dir, err := os.MkdirTemp("", "kc")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	log := logr.Discard()
	ctx := context.Background()

	// The kubelet's own topology manager, on a machine of two NUMA nodes.
	tm, err := topologymanager.NewManager(log, []cadvisorapi.Node{{Id: 0}, {Id: 1}},
		topologymanager.PolicySingleNumaNode, topologymanager.ContainerTopologyScope, nil)
	if err != nil {
		panic(err)
	}

	// Two pods that ask for two devices each, as the kubelet's pod manager
	// lists them.
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "default", UID: "uid-1"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{"example.com/gpu": resource.MustParse("2")},
		}}}},
	}
	second := pod.DeepCopy()
	second.Name, second.UID = "train-2", "uid-2"
	activePods := func() []*v1.Pod { return []*v1.Pod{pod, second} }

	// --- the swap ---
	dm, err := kubeletcompat.New(devicemanager.Options{SocketDir: dir, NUMANodes: []int{0, 1}, Logger: log}, tm)
	if err != nil {
		panic(err)
	}
	tm.AddHintProvider(log, dm)
	if err := dm.Start(log, activePods, allSourcesReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		panic(err)
	}
	defer func() { _ = dm.Stop(log) }()
	// --- end of the swap ---

	// A plugin with one device on node 0 and two on node 1 registers.
	numa := func(n int64) *pluginapi.TopologyInfo {
		return &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: n}}}
	}
	plugin, err := plugintest.New(plugintest.Options{ResourceName: "example.com/gpu", SocketDir: dir, Devices: []*pluginapi.Device{
		{ID: "gpu-a", Health: pluginapi.Healthy, Topology: numa(0)},
		{ID: "gpu-b", Health: pluginapi.Healthy, Topology: numa(1)},
		{ID: "gpu-c", Health: pluginapi.Healthy, Topology: numa(1)},
	}})
	if err != nil {
		panic(err)
	}
	defer plugin.Stop()
	if err := plugin.Start(); err != nil {
		panic(err)
	}
	if err := plugin.Register(filepath.Join(dir, devicemanager.KubeletSocketName)); err != nil {
		panic(err)
	}
	// Its devices count once its first ListAndWatch message is in.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for _, allocatable, _ := dm.GetCapacity(log); allocatable.Name("example.com/gpu", resource.DecimalSI).Value() < 3; _, allocatable, _ = dm.GetCapacity(log) {
		select {
		case <-tick.C:
		case <-deadline:
			panic("the plugin's devices did not arrive")
		}
	}

	// The first pod: only node 1 can give it both its devices.
	result := tm.Admit(ctx, &lifecycle.PodAdmitAttributes{Pod: pod, Operation: lifecycle.AddOperation})
	fmt.Println("admitted:", result.Admit)
	fmt.Println("NUMA affinity:", tm.GetAffinity(log, "uid-1", "app").NUMANodeAffinity.GetBits())
	fmt.Println("devices:", slices.Sorted(maps.Keys(dm.GetDevices("uid-1", "app")["example.com/gpu"])))

	// The second fits on no single node any more: the policy refuses it.
	result = tm.Admit(ctx, &lifecycle.PodAdmitAttributes{Pod: second, Operation: lifecycle.AddOperation})
	fmt.Println("second admitted:", result.Admit, result.Reason)
	// Output:
	// admitted: true
	// NUMA affinity: [1]
	// devices: [gpu-b gpu-c]
	// second admitted: false TopologyAffinityError
}
