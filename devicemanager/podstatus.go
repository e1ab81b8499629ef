package devicemanager

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// UpdateAllocatedResourcesStatus sets, for every regular container in status,
// the health of each device allocated to it: "Healthy" when its plugin last
// reported it healthy or does not report it at all (the kubelet's choice),
// else "Unhealthy". Resources and devices are in sorted order.
func (m *ManagerImpl) UpdateAllocatedResourcesStatus(pod *v1.Pod, status *v1.PodStatus) {
	if pod == nil || status == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range status.ContainerStatuses {
		cs := &status.ContainerStatuses[i]
		view := m.core.ledger.DeviceView(string(pod.UID), cs.Name)
		for _, name := range sets.List(sets.KeySet(view)) {
			var r *resourceState
			if rr := m.core.resources[name]; rr != nil {
				r = rr
			}
			rs := v1.ResourceStatus{Name: v1.ResourceName(name), Resources: []v1.ResourceHealth{}}
			for _, id := range sets.List(sets.KeySet(view[name])) {
				health := v1.ResourceHealthStatusHealthy
				if r != nil {
					if d := r.device(id); d != nil && d.Health != pluginapi.Healthy {
						health = v1.ResourceHealthStatusUnhealthy
					}
				}
				rs.Resources = append(rs.Resources, v1.ResourceHealth{ResourceID: v1.ResourceID(id), Health: health})
			}
			upsertResourceStatus(cs, rs)
		}
	}
}

func upsertResourceStatus(cs *v1.ContainerStatus, rs v1.ResourceStatus) {
	if cs.AllocatedResourcesStatus == nil {
		cs.AllocatedResourcesStatus = []v1.ResourceStatus{}
	}
	for i := range cs.AllocatedResourcesStatus {
		if cs.AllocatedResourcesStatus[i].Name == rs.Name {
			cs.AllocatedResourcesStatus[i] = rs
			return
		}
	}
	cs.AllocatedResourcesStatus = append(cs.AllocatedResourcesStatus, rs)
}
