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
	if c := cmp.Compare(a.PodUID, b.PodUID); c != 0 {
		return c
	}
	return cmp.Compare(a.ContainerName, b.ContainerName)
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

// numaMap places each ID under the NUMA nodes devs reports for it: under
// every node of a multi-node device, under NoTopology for a device with no
// topology, an empty node list or no entry in devs (upstream dereferences nil
// there). Each list is sorted; IDs repeated in ids are listed once.
func numaMap(ids []string, devs DeviceInstances) checkpoint.DevicesPerNUMA {
	out := checkpoint.DevicesPerNUMA{}
	seen := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		if _, dup := seen[id]; dup {
			continue
		}
		seen[id] = struct{}{}
		placed := false
		for _, node := range nodesOf(devs[id]) {
			out[node] = append(out[node], id)
			placed = true
		}
		if !placed {
			out[NoTopology] = append(out[NoTopology], id)
		}
	}
	for _, list := range out {
		slices.Sort(list)
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
