package topology_test

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/topology"
)

func onNode(id string, node int64) *pluginapi.Device {
	return &pluginapi.Device{ID: id, Health: pluginapi.Healthy,
		Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: node}}}}
}

// A GPU plugin advertises two GPUs on each of NUMA nodes 0 and 1 of a
// four-node machine; gpu0 is already in use. A container asks for two GPUs.
func Example() {
	devices := map[string]*pluginapi.Device{
		"gpu0": onNode("gpu0", 0), "gpu1": onNode("gpu1", 0),
		"gpu2": onNode("gpu2", 1), "gpu3": onNode("gpu3", 1),
	}
	hints := topology.ResourceHints(topology.HintRequest{
		MachineNodes: []int{0, 1, 2, 3},
		Devices:      devices,
		Available:    sets.New("gpu1", "gpu2", "gpu3"),
		Request:      2,
	})
	fmt.Println("hints:", hints)

	// The topology manager picks node 1; allocation then takes devices in
	// tier order.
	chosen := hints[0].NUMANodeAffinity
	tiers := topology.FilterByAffinity(chosen, devices, sets.New("gpu1", "gpu2", "gpu3"))
	fmt.Println("nodes:", chosen.GetBits(), "aligned:", tiers.Aligned, "unaligned:", tiers.Unaligned)
	// Output:
	// hints: [{10 true} {11 false}]
	// nodes: [1] aligned: [gpu2 gpu3] unaligned: [gpu1]
}

func ExampleIterateBitMasks() {
	topology.IterateBitMasks([]int{0, 2, 3}, func(m topology.BitMask) {
		fmt.Print(m.GetBits(), " ")
	})
	fmt.Println()
	// Output:
	// [0] [2] [3] [0 2] [0 3] [2 3] [0 2 3]
}
