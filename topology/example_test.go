package topology_test

import (
	"fmt"
	"maps"
	"slices"

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
	// Count the devices once; count again when they or their health change.
	census := topology.CountDevices(maps.All(devices), len(devices), func(id string) bool {
		return devices[id].Health == pluginapi.Healthy
	})
	allocated := sets.New("gpu0")
	hints := census.Hints([]int{0, 1, 2, 3}, allocated, nil, nil, 2)
	fmt.Println("hints:", hints)

	// The topology manager picks node 1; allocation then takes the free
	// devices in tier order.
	chosen := hints[0].NUMANodeAffinity
	ids := slices.Sorted(maps.Keys(devices))
	tiers := census.Tiers(chosen, ids, func(id string) bool { return !allocated.Has(id) })
	fmt.Println("nodes:", chosen.GetBits(), "aligned:", tiers.Aligned, "unaligned:", tiers.Unaligned)
	// Output:
	// hints: [{10 true} {11 false}]
	// nodes: [1] aligned: [gpu2 gpu3] unaligned: [gpu1]
}
