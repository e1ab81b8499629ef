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
		if !m.isDevicePluginResourceLocked(res) {
			continue
		}
		hints[res] = m.hintsLocked(res, int(q.Value()),
			m.ledger.ContainerDevices(podUID, container.Name, res), m.reuse[podUID][res])
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
		if !m.isDevicePluginResourceLocked(res) {
			continue
		}
		hints[res] = m.hintsLocked(res, int(n), m.ledger.PodDevices(podUID, res), nil)
	}
	return hints
}

// hintsLocked computes the hints of one resource. Expects m.mu held.
func (m *ManagerImpl) hintsLocked(res string, request int, held, reusable sets.Set[string]) []topology.Hint {
	r := m.resources[res]
	if r == nil || len(m.opts.NUMANodes) == 0 {
		return nil
	}
	return m.censusLocked(r).Hints(m.opts.NUMANodes, m.ledger.Allocated(res), reusable, held, request)
}
