package topology

import (
	"fmt"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// numaDev returns a device on the given NUMA nodes (a non-nil, possibly
// empty, node list).
func numaDev(id string, nodes ...int64) *pluginapi.Device {
	topo := &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{}}
	for _, n := range nodes {
		topo.Nodes = append(topo.Nodes, &pluginapi.NUMANode{ID: n})
	}
	return &pluginapi.Device{ID: id, Health: pluginapi.Healthy, Topology: topo}
}

// plainDev returns a device with nil Topology.
func plainDev(id string) *pluginapi.Device {
	return &pluginapi.Device{ID: id, Health: pluginapi.Healthy}
}

func deviceMap(devs ...*pluginapi.Device) map[string]*pluginapi.Device {
	m := make(map[string]*pluginapi.Device, len(devs))
	for _, d := range devs {
		m[d.ID] = d
	}
	return m
}

// mask builds a BitMask of valid nodes; a bad node is a bug in the test.
func mask(nodes ...int) BitMask {
	m, err := NewBitMask(nodes...)
	if err != nil {
		panic(fmt.Sprintf("test mask %v: %v", nodes, err))
	}
	return m
}

func hint(preferred bool, nodes ...int) Hint {
	m := mask(nodes...)
	return Hint{NUMANodeAffinity: &m, Preferred: preferred}
}

// seqNodes returns 0..n-1.
func seqNodes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
