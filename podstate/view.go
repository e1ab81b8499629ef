package podstate

import (
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
		nodes := make(map[string][]int64, len(rec.ids))
		for node, ids := range rec.numa {
			for _, id := range ids {
				if node == NoTopology {
					if _, ok := nodes[id]; !ok {
						nodes[id] = nil
					}
					continue
				}
				nodes[id] = append(nodes[id], node)
			}
		}
		devs := make(DeviceInstances, len(nodes))
		for id, ns := range nodes {
			dev := &pluginapi.Device{}
			if len(ns) > 0 {
				slices.Sort(ns)
				ns = slices.Compact(ns)
				dev.Topology = &pluginapi.TopologyInfo{Nodes: make([]*pluginapi.NUMANode, len(ns))}
				for i, n := range ns {
					dev.Topology.Nodes[i] = &pluginapi.NUMANode{ID: n}
				}
			}
			devs[id] = dev
		}
		out[res] = devs
	}
	return out
}
