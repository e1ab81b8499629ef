package kubeletcompat

import (
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	kubeletdm "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager/bitmask"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/podstate"
	"github.com/openkubelet/devmgr/topology"
)

// containerMap lists the kubelet's container map as devmgr's.
func containerMap(in containermap.ContainerMap) podstate.ContainerMap {
	if in == nil {
		return nil
	}
	out := make(podstate.ContainerMap, len(in))
	for id := range in {
		pod, name, err := in.GetContainerRef(id)
		if err != nil {
			continue
		}
		out[id] = podstate.ContainerRef{PodUID: pod, ContainerName: name}
	}
	return out
}

// hints converts devmgr's hints, keeping nil apart from empty: a nil list
// is "no preference", an empty one "no placement fits".
func hints(in map[string][]topology.Hint) map[string][]topologymanager.TopologyHint {
	if in == nil {
		return nil
	}
	out := make(map[string][]topologymanager.TopologyHint, len(in))
	for res, hs := range in {
		if hs == nil {
			out[res] = nil
			continue
		}
		list := make([]topologymanager.TopologyHint, len(hs))
		for i, h := range hs {
			list[i] = topologymanager.TopologyHint{Preferred: h.Preferred}
			if h.NUMANodeAffinity != nil {
				// devmgr's masks hold nodes 0-63, which NewBitMask accepts.
				list[i].NUMANodeAffinity, _ = bitmask.NewBitMask(h.NUMANodeAffinity.GetBits()...)
			}
		}
		out[res] = list
	}
	return out
}

// fromKubeletHint converts the topology manager's affinity to devmgr's.
func fromKubeletHint(h topologymanager.TopologyHint) topology.Hint {
	out := topology.Hint{Preferred: h.Preferred}
	if h.NUMANodeAffinity != nil {
		mask, err := topology.NewBitMask(h.NUMANodeAffinity.GetBits()...)
		if err == nil {
			out.NUMANodeAffinity = &mask
		}
	}
	return out
}

// resourceDevices converts devmgr's device map to the kubelet's type.
func resourceDevices(in devicemanager.ResourceDeviceInstances) kubeletdm.ResourceDeviceInstances {
	if in == nil {
		return nil
	}
	out := make(kubeletdm.ResourceDeviceInstances, len(in))
	for res, devs := range in {
		out[res] = kubeletdm.DeviceInstances(devs)
	}
	return out
}

// runOptions converts devmgr's run options to the kubelet's, field by field.
func runOptions(in *devicemanager.DeviceRunContainerOptions) *kubeletdm.DeviceRunContainerOptions {
	if in == nil {
		return nil
	}
	out := &kubeletdm.DeviceRunContainerOptions{}
	for _, e := range in.Envs {
		out.Envs = append(out.Envs, kubecontainer.EnvVar{Name: e.Name, Value: e.Value})
	}
	for _, mnt := range in.Mounts {
		out.Mounts = append(out.Mounts, kubecontainer.Mount{
			Name:           mnt.Name,
			ContainerPath:  mnt.ContainerPath,
			HostPath:       mnt.HostPath,
			ReadOnly:       mnt.ReadOnly,
			SELinuxRelabel: mnt.SELinuxRelabel,
		})
	}
	for _, d := range in.Devices {
		out.Devices = append(out.Devices, kubecontainer.DeviceInfo{
			PathOnHost:      d.PathOnHost,
			PathInContainer: d.PathInContainer,
			Permissions:     d.Permissions,
		})
	}
	for _, a := range in.Annotations {
		out.Annotations = append(out.Annotations, kubecontainer.Annotation{Name: a.Name, Value: a.Value})
	}
	for _, c := range in.CDIDevices {
		out.CDIDevices = append(out.CDIDevices, kubecontainer.CDIDevice{Name: c.Name})
	}
	return out
}
