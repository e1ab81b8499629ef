package podstate

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
)

// NoTopology is the NUMA key under which a record lists devices that report
// no NUMA node.
const NoTopology int64 = -1

// ContainerRef names one container of one pod.
type ContainerRef struct{ PodUID, ContainerName string }

func compareRefs(a, b ContainerRef) int {
	return cmp.Or(cmp.Compare(a.PodUID, b.PodUID), cmp.Compare(a.ContainerName, b.ContainerName))
}

// ContainerMap maps a runtime container ID to the container it belongs to. It
// is the snapshot of containers the caller found at start; nil means none.
type ContainerMap map[string]ContainerRef

// IsRunning reports whether some container ID owned by (podUID, containerName)
// is in running (every ID is checked, not only one).
func (m ContainerMap) IsRunning(podUID, containerName string, running sets.Set[string]) bool {
	want := ContainerRef{PodUID: podUID, ContainerName: containerName}
	for id, ref := range m {
		if ref == want && running.Has(id) {
			return true
		}
	}
	return false
}

// DeviceInstances maps a device ID to the device as its plugin last reported it.
type DeviceInstances map[string]*pluginapi.Device

// ResourceDeviceInstances maps a resource name to its devices.
type ResourceDeviceInstances map[string]DeviceInstances

// numaMap places each of ids (distinct and sorted, as a reservation holds
// them) under the NUMA nodes devs reports for it: under every node of a
// multi-node device, under NoTopology for a device with no topology, an empty
// node list or no entry in devs (upstream dereferences nil there).
func numaMap(ids []string, devs DeviceInstances) checkpoint.DevicesPerNUMA {
	out := checkpoint.DevicesPerNUMA{}
	for _, id := range ids {
		nodes := nodesOf(devs[id])
		if len(nodes) == 0 {
			nodes = []int64{NoTopology}
		}
		for _, node := range nodes {
			out[node] = append(out[node], id)
		}
	}
	return out
}

// nodesOf returns the distinct NUMA node IDs a device reports, ascending.
func nodesOf(d *pluginapi.Device) []int64 {
	var nodes []int64
	for _, n := range d.GetTopology().GetNodes() {
		if n != nil {
			nodes = append(nodes, n.ID)
		}
	}
	slices.Sort(nodes)
	return slices.Compact(nodes)
}
