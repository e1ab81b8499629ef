package podstate_test

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/podstate"
	"github.com/openkubelet/devmgr/topology"
)

// One container's admission for one resource, as devicemanager runs it (its
// lock and the plugin calls left out).
func Example() {
	const gpu = "example.com/gpu"
	l := podstate.NewLedger()
	healthy := sets.New("gpu-0", "gpu-1", "gpu-2")
	devices := podstate.DeviceInstances{
		"gpu-0": {ID: "gpu-0", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 0}}}},
	}

	needed, err := podstate.CheckRequest(podstate.RequestCheck{
		PodUID: "pod-1", ContainerName: "main", Resource: gpu, Required: 2,
		Held: l.ContainerDevices("pod-1", "main", gpu), Registered: true, Healthy: healthy,
	})
	if err != nil {
		panic(err)
	}
	available := healthy.Difference(l.Allocated(gpu))
	in := podstate.SelectInput{
		Resource: gpu, Required: 2, Needed: needed, Available: available,
		Tiers: topology.Tiers{NoTopology: sets.List(available)},
	}
	if q, ask := podstate.PreferredQueryFor(in); ask {
		fmt.Println("ask the plugin to choose", q.Size, "of", q.Available)
	}
	picks, err := podstate.Select(in, []string{"gpu-2"})
	if err != nil {
		panic(err)
	}
	rid, err := l.Reserve("pod-1", "main", gpu, picks)
	if err != nil {
		panic(err)
	}
	// ... the plugin's Allocate(picks) runs here, without the lock ...
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"GPUS": "gpu-0,gpu-2"}}
	if err := l.Commit(rid, devices, resp); err != nil {
		panic(err)
	}

	opts, _ := l.RunOptions("pod-1", "main")
	entries, _ := l.ToCheckpoint()
	fmt.Println("picked", picks)
	fmt.Println("envs", opts.Envs)
	fmt.Println("checkpoint", entries[0].PodUID, entries[0].ResourceName, entries[0].DeviceIDs)
	fmt.Println("free", healthy.Difference(l.Allocated(gpu)).UnsortedList())
	// Output:
	// ask the plugin to choose 2 of [gpu-0 gpu-1 gpu-2]
	// picked [gpu-0 gpu-2]
	// envs [{GPUS gpu-0,gpu-2}]
	// checkpoint pod-1 example.com/gpu map[-1:[gpu-2] 0:[gpu-0]]
	// free [gpu-1]
}
