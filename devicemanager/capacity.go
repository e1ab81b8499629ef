package devicemanager

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// GetCapacity returns, per registered resource, its device count (capacity)
// and its healthy device count (allocatable), and the names of resources it
// removed. A resource whose plugin has been gone for longer than
// StopGracePeriod is removed here, reported once in removed, and the
// checkpoint is rewritten without it. Safe before Start and after Stop.
func (m *ManagerImpl) GetCapacity() (capacity, allocatable v1.ResourceList, removed []string) {
	capacity, allocatable = v1.ResourceList{}, v1.ResourceList{}
	m.mu.Lock()
	for name, r := range m.resources {
		if !r.registered {
			continue
		}
		if r.primary == nil || r.primary.GracePeriodExpired(m.opts.StopGracePeriod) {
			removed = append(removed, name)
			continue
		}
		capacity[v1.ResourceName(name)] = *resource.NewQuantity(int64(r.capacityLen()), resource.DecimalSI)
		allocatable[v1.ResourceName(name)] = *resource.NewQuantity(int64(r.healthyLen()), resource.DecimalSI)
	}
	var gen uint64
	if len(removed) > 0 {
		slices.Sort(removed)
		m.collectResourcesLocked(removed)
		m.gen++
		gen = m.gen
	}
	m.mu.Unlock()

	if len(removed) > 0 {
		m.log.V(2).Info("Removed resources whose device plugin is gone", keyRemoved, removed)
		if err := m.persist(gen); err != nil {
			m.log.Error(err, "Failed to write checkpoint after removing resources", keyRemoved, removed)
		}
	}
	return capacity, allocatable, removed
}

// collectResourcesLocked retires resources whose plugin is gone for good:
// they leave capacity and the checkpoint. Their allocations stay in the
// ledger until their pods go, and their last device list is kept, as the
// kubelet does, for device health in pod status and for hints. Admissions
// waiting for their plugin look again. Expects m.mu held.
func (m *ManagerImpl) collectResourcesLocked(names []string) {
	for _, name := range names {
		r := m.resources[name]
		r.registered = false
		r.primary = nil
		r.census = nil
	}
	m.readyChangedLocked()
}

// GetAllocatableDevices returns the healthy devices of every resource whose
// plugin reported a device list (possibly none healthy: an empty map). A
// resource restored from the checkpoint whose plugin has not reported yet is
// left out. The *Device values are shared and must not be modified.
func (m *ManagerImpl) GetAllocatableDevices() ResourceDeviceInstances {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := ResourceDeviceInstances{}
	for name, r := range m.resources {
		if !r.registered || !r.listed {
			continue
		}
		devs := make(DeviceInstances, r.healthyLen())
		for _, d := range r.devices {
			if r.isHealthy(d.id) {
				devs[d.id] = d.dev
			}
		}
		out[name] = devs
	}
	return out
}

// GetDevices returns the devices allocated to one container, per resource,
// with their NUMA nodes (the podresources view); nil for an unknown container.
func (m *ManagerImpl) GetDevices(podUID, containerName string) ResourceDeviceInstances {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ledger.DeviceView(podUID, containerName)
}

// isDevicePluginResourceLocked reports whether resource is served by a device
// plugin: registered now (or restored from the checkpoint), or holding
// allocations. Expects m.mu held.
func (m *ManagerImpl) isDevicePluginResourceLocked(name string) bool {
	if r := m.resources[name]; r != nil && r.registered {
		return true
	}
	return m.ledger.AllocatedCount(name) > 0
}

// UpdatePluginResources returns allocatable raised, per resource, to at least
// the number of devices allocated node-wide, when pod holds devices (so pods
// already bound keep passing admission after a plugin failure); otherwise it
// returns allocatable unchanged. allocatable itself is never modified.
func (m *ManagerImpl) UpdatePluginResources(allocatable v1.ResourceList, pod *v1.Pod) v1.ResourceList {
	m.mu.Lock()
	defer m.mu.Unlock()
	if pod == nil || !m.ledger.HasPod(string(pod.UID)) {
		return allocatable
	}
	out := allocatable
	cloned := false
	for _, name := range m.ledger.AllocatedResources() {
		n := int64(m.ledger.AllocatedCount(name))
		if q, ok := allocatable[v1.ResourceName(name)]; ok && q.Value() >= n {
			continue
		}
		if !cloned {
			out = allocatable.DeepCopy()
			if out == nil {
				out = v1.ResourceList{}
			}
			cloned = true
		}
		out[v1.ResourceName(name)] = *resource.NewQuantity(n, resource.DecimalSI)
	}
	return out
}

// ShouldResetExtendedResourceCapacity reports whether the checkpoint directory
// is empty (every name starting with "." aside): the node was wiped, so
// extended resources advertised before must be reset.
func (m *ManagerImpl) ShouldResetExtendedResourceCapacity() bool {
	keys, err := m.store.ListCheckpoints()
	return err == nil && len(keys) == 0
}

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
		view := m.ledger.DeviceView(string(pod.UID), cs.Name)
		for _, name := range sets.List(sets.KeySet(view)) {
			var r *resourceState
			if rr := m.resources[name]; rr != nil {
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

// UpdateAllocatedDevices garbage-collects: allocations of pods that are no
// longer active are dropped (pending reservations and pods being admitted
// are kept). It does nothing until the pod sources are ready, and it does not
// write the checkpoint. An embedder whose pod sources become ready after
// Start calls it then, so that what the checkpoint holds for pods that are
// gone is released before anything reads the allocations.
func (m *ManagerImpl) UpdateAllocatedDevices() { m.collectInactivePods(ReleasePodInactive) }

// collectInactivePods is UpdateAllocatedDevices; reason goes with the
// events of what it releases.
func (m *ManagerImpl) collectInactivePods(reason ReleaseReason) {
	m.mu.Lock()
	activePods, ready := m.activePods, m.sourcesReady
	// A pod admitted after the list is read is not in it, yet is active:
	// only pods whose last commit is older than the list are collected.
	seen := m.commitSeq
	m.mu.Unlock()
	pods := activePods()
	if !ready.AllReady() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.collectPodsLocked(pods, seen, reason)
}

// collectPodsLocked drops the records of pods not in active, except pods
// being admitted and pods that committed an allocation after commit sequence
// seen (the active list may predate them), and reports them released for
// reason. It is the only place records leave the ledger once admitted.
// Expects m.mu held.
func (m *ManagerImpl) collectPodsLocked(active []*v1.Pod, seen uint64, reason ReleaseReason) {
	if m.ledger.Len() == 0 {
		return
	}
	isActive := make(sets.Set[string], len(active))
	for _, p := range active {
		isActive.Insert(string(p.UID))
	}
	var gone []string
	for uid := range m.ledger.Pods() {
		if !isActive.Has(uid) && m.inflight[uid] == 0 && m.lastCommit[uid] <= seen {
			gone = append(gone, uid)
		}
	}
	if len(gone) == 0 {
		return
	}
	slices.Sort(gone)
	m.pushReleasedLocked(gone, reason)
	m.ledger.DeletePods(gone...)
	for _, uid := range gone {
		delete(m.reuse, uid)
		delete(m.lastCommit, uid)
	}
	m.log.V(3).Info("Removed allocations of inactive pods", "podUIDs", gone)
}
