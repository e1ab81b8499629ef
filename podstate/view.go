package podstate

import (
	"maps"
	"slices"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// DeviceView returns the container's devices as the podresources API and
// devicemanager.GetDevices see them: resource -> device ID -> a
// Device with only Topology set. A device recorded under NUMA nodes gets those
// nodes, ascending (NoTopology ignored next to real nodes); a device recorded
// only under NoTopology gets a nil Topology. Records with no devices are left
// out. An unknown pod or container yields nil. Upstream orders the nodes and
// handles a device under both -1 and a real node by map iteration order.
func (l *Ledger) DeviceView(podUID, containerName string) ResourceDeviceInstances {
	recs, ok := l.pods[podUID][containerName]
	if !ok {
		return nil
	}
	out := make(ResourceDeviceInstances, len(recs))
	for res, rec := range recs {
		if len(rec.ids) == 0 {
			continue
		}
		devs := make(DeviceInstances, len(rec.ids))
		for _, id := range rec.ids {
			devs[id] = &pluginapi.Device{}
		}
		for _, node := range slices.Sorted(maps.Keys(rec.numa)) {
			if node == NoTopology {
				continue
			}
			for _, id := range rec.numa[node] {
				if t := devs[id].Topology; t == nil {
					devs[id].Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: node}}}
				} else if t.Nodes[len(t.Nodes)-1].ID != node { // not a repeat within the list
					t.Nodes = append(t.Nodes, &pluginapi.NUMANode{ID: node})
				}
			}
		}
		out[res] = devs
	}
	return out
}
