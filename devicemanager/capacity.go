package devicemanager

import (
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// GetCapacity returns, per registered resource, its device count (capacity)
// and its healthy device count less the healthy devices ResourceClaims hold
// (allocatable: what pods can still be given), and the names of resources it
// removed. A resource whose plugin has been gone for longer than
// StopGracePeriod is removed here, reported once in removed, and the
// checkpoint is rewritten without it. Safe before Start and after Stop.
func (m *ManagerImpl) GetCapacity() (capacity, allocatable v1.ResourceList, removed []string) {
	m.mu.Lock()
	capacity, allocatable, removed, eff := m.core.capacity(m.opts.Clock.Now())
	m.signal(eff)
	m.mu.Unlock()
	if len(removed) > 0 {
		m.log.V(2).Info("Removed resources whose device plugin is gone", keyRemoved, removed)
		m.persistFor(eff, "after removing resources")
	}
	return capacity, allocatable, removed
}

// capacity is GetCapacity's rule: registered resources count, those whose
// plugin has been gone past the grace period at now are removed.
func (c *core) capacity(now time.Time) (capacity, allocatable v1.ResourceList, removed []string, eff effects) {
	capacity, allocatable = v1.ResourceList{}, v1.ResourceList{}
	claimed := c.claimedHealthy()
	for name, r := range c.resources {
		if !r.registered {
			continue
		}
		if r.primary == nil || c.graceOver(r.primary, now) {
			removed = append(removed, name)
			continue
		}
		capacity[v1.ResourceName(name)] = *resource.NewQuantity(int64(r.capacityLen()), resource.DecimalSI)
		allocatable[v1.ResourceName(name)] = *resource.NewQuantity(int64(r.healthyLen()-claimed[name]), resource.DecimalSI)
	}
	if len(removed) > 0 {
		slices.Sort(removed)
		eff = c.removeResources(removed)
	}
	return capacity, allocatable, removed, eff
}

// claimedHealthy counts, per resource, the healthy devices claims hold.
func (c *core) claimedHealthy() map[string]int {
	n := map[string]int{}
	for uid := range c.ledger.Pods() {
		if !isClaim(uid) {
			continue
		}
		for _, h := range c.ledger.Holdings(uid) {
			if r := c.resources[h.Resource]; r != nil {
				for _, id := range h.DeviceIDs {
					if r.isHealthy(id) {
						n[h.Resource]++
					}
				}
			}
		}
	}
	return n
}

// removeResources retires resources whose plugin is gone for good: they
// leave capacity and the checkpoint. Their allocations stay in the ledger
// until their pods go, and their last device list is kept, as the kubelet
// does, for device health in pod status and for hints. Admissions waiting
// for their plugin look again.
func (c *core) removeResources(names []string) effects {
	for _, name := range names {
		r := c.resources[name]
		r.registered = false
		r.primary = nil
		r.census = nil
	}
	eff := c.changed()
	eff.ready = true
	return eff
}

// GetAllocatableDevices returns the healthy devices of every resource whose
// plugin reported a device list (possibly none healthy: an empty map). A
// resource restored from the checkpoint whose plugin has not reported yet is
// left out. The *Device values are shared and must not be modified.
func (m *ManagerImpl) GetAllocatableDevices() ResourceDeviceInstances {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := ResourceDeviceInstances{}
	for name, r := range m.core.resources {
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
	return m.core.ledger.DeviceView(podUID, containerName)
}

// UpdatePluginResources returns allocatable raised, per resource, to at least
// the number of devices allocated node-wide, when pod holds devices (so pods
// already bound keep passing admission after a plugin failure); otherwise it
// returns allocatable unchanged. allocatable itself is never modified.
func (m *ManagerImpl) UpdatePluginResources(allocatable v1.ResourceList, pod *v1.Pod) v1.ResourceList {
	m.mu.Lock()
	defer m.mu.Unlock()
	if pod == nil || !m.core.ledger.HasPod(string(pod.UID)) {
		return allocatable
	}
	out := allocatable
	cloned := false
	for _, name := range m.core.ledger.AllocatedResources() {
		n := int64(m.core.ledger.AllocatedCount(name))
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
	keys, err := m.writer.store.ListCheckpoints()
	return err == nil && len(keys) == 0
}
