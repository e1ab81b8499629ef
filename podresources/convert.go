package podresources

import (
	"maps"
	"slices"

	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/openkubelet/devmgr/devicemanager"
)

// reportedContainers returns the names of the containers of pod that the
// API reports, in the kubelet's order: restartable init containers
// (sidecars), then regular containers, each in spec order.
func reportedContainers(pod *v1.Pod) []string {
	names := make([]string, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			names = append(names, c.Name)
		}
	}
	for i := range pod.Spec.Containers {
		names = append(names, pod.Spec.Containers[i].Name)
	}
	return names
}

// containerDevices converts devices to the API's form, as the kubelet does:
// one ContainerDevices per (resource, device, NUMA node) with a single
// device ID and a single-node topology, or one with no topology for a device
// that reports no NUMA node. Unlike the kubelet's, the result is sorted by
// resource, device ID and node, a device's repeated nodes count once, and a
// device whose topology lists no node is reported without topology instead
// of being left out. nil for no devices.
func containerDevices(devices devicemanager.ResourceDeviceInstances) []*podresourcesv1.ContainerDevices {
	var out []*podresourcesv1.ContainerDevices
	for _, res := range slices.Sorted(maps.Keys(devices)) {
		devs := devices[res]
		for _, id := range slices.Sorted(maps.Keys(devs)) {
			nodes := numaNodes(devs[id])
			if len(nodes) == 0 {
				out = append(out, &podresourcesv1.ContainerDevices{ResourceName: res, DeviceIds: []string{id}})
				continue
			}
			for _, n := range nodes {
				out = append(out, &podresourcesv1.ContainerDevices{
					ResourceName: res,
					DeviceIds:    []string{id},
					Topology:     &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: n}}},
				})
			}
		}
	}
	return out
}

// numaNodes returns the distinct NUMA nodes of d, ascending; nil entries are
// skipped.
func numaNodes(d *pluginapi.Device) []int64 {
	var nodes []int64
	for _, n := range d.GetTopology().GetNodes() {
		if n != nil {
			nodes = append(nodes, n.GetID())
		}
	}
	slices.Sort(nodes)
	return slices.Compact(nodes)
}
