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

// Clone copies the outer and the inner maps; the *Device values are shared.
// The result is never nil.
func (r ResourceDeviceInstances) Clone() ResourceDeviceInstances {
	out := make(ResourceDeviceInstances, len(r))
	for res, devs := range r {
		inner := make(DeviceInstances, len(devs))
		for id, d := range devs {
			inner[id] = d
		}
		out[res] = inner
	}
	return out
}

// Filter returns, for each resource of cond that r also has, a new map of the
// devices of r whose IDs are in cond[res]. IDs of cond unknown to r are
// ignored; a resource of cond whose IDs are all unknown yields an empty map.
// The *Device values are shared. The result is never nil.
func (r ResourceDeviceInstances) Filter(cond map[string]sets.Set[string]) ResourceDeviceInstances {
	out := make(ResourceDeviceInstances, len(cond))
	for res, ids := range cond {
		devs, ok := r[res]
		if !ok {
			continue
		}
		inner := make(DeviceInstances, len(ids))
		for id := range ids {
			if d, ok := devs[id]; ok {
				inner[id] = d
			}
		}
		out[res] = inner
	}
	return out
}

// NUMAMap places each ID under the NUMA nodes devs reports for it: under
// every node of a multi-node device, under NoTopology for a device with no
// topology, an empty node list or no entry in devs (upstream dereferences nil
// there). Each list is sorted; IDs repeated in ids are listed once.
func NUMAMap(ids []string, devs DeviceInstances) checkpoint.DevicesPerNUMA {
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
