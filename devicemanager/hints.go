package devicemanager

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/openkubelet/devmgr/topology"
)

// GetTopologyHints returns, for each device-plugin resource the container
// asks for, the NUMA placements that can satisfy it: nil means no preference
// (the resource has no topology, or the machine none), an empty slice means
// nothing can satisfy it. A container that already holds devices gets the
// hints of exactly those devices.
func (m *ManagerImpl) GetTopologyHints(pod *v1.Pod, container *v1.Container) map[string][]topology.Hint {
	if pod == nil || container == nil {
		return nil
	}
	m.UpdateAllocatedDevices()
	podUID := string(pod.UID)
	m.mu.Lock()
	defer m.mu.Unlock()
	hints := map[string][]topology.Hint{}
	for name, q := range container.Resources.Limits {
		res := string(name)
		if !m.core.isDevicePluginResource(res) {
			continue
		}
		hints[res] = m.core.hints(res, int(q.Value()),
			m.core.ledger.ContainerDevices(podUID, container.Name, res), m.core.reusable(podUID, res))
	}
	return hints
}

// GetPodTopologyHints is GetTopologyHints for the whole pod: requests are the
// pod's aggregated limits (sidecars included), already allocated devices are
// those of all its containers, and there is no reuse pool.
func (m *ManagerImpl) GetPodTopologyHints(pod *v1.Pod) map[string][]topology.Hint {
	if pod == nil {
		return nil
	}
	m.UpdateAllocatedDevices()
	podUID := string(pod.UID)
	requests := topology.PodRequests(pod)
	m.mu.Lock()
	defer m.mu.Unlock()
	hints := map[string][]topology.Hint{}
	for res, n := range requests {
		if !m.core.isDevicePluginResource(res) {
			continue
		}
		hints[res] = m.core.hints(res, int(n), m.core.ledger.PodDevices(podUID, res), nil)
	}
	return hints
}

// hints computes the hints of one resource.
func (c *core) hints(res string, request int, held, reusable sets.Set[string]) []topology.Hint {
	r := c.resources[res]
	if r == nil || len(c.numaNodes) == 0 {
		return nil
	}
	return c.census(r).Hints(c.numaNodes, c.ledger.Allocated(res), reusable, held, request)
}
