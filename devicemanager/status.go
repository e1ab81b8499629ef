package devicemanager

import (
	"slices"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/podstate"
)

// ResourceStatus describes one resource for operators and tools: its devices
// as last reported, its counts, and its plugin instances. Counts follow
// GetCapacity: Capacity = all devices, Allocatable = healthy devices, Free =
// healthy devices that no container holds or reserves.
type ResourceStatus struct {
	Name                   string
	Capacity               int
	Allocatable            int
	Allocated              int
	Free                   int
	Devices                []DeviceStatus
	Endpoints              []EndpointStatus
	RestoredFromCheckpoint bool // known from the checkpoint; no plugin has reported yet
}

// DeviceStatus is one device of a ResourceStatus.
type DeviceStatus struct {
	ID        string
	Health    string // as reported by the plugin; "Unhealthy" while the plugin is gone
	NUMANodes []int64
	Allocated bool
	// Claimed: a ResourceClaim holds it (PrepareClaim); Allocated too.
	Claimed bool
}

// EndpointStatus is one plugin instance of a resource.
type EndpointStatus struct {
	Resource                        string
	Socket                          string // the socket path, or local:<resource> (RegisterLocal)
	PreStartRequired                bool
	GetPreferredAllocationAvailable bool
	// Stopped: the instance's stream ended; the resource stays visible for
	// the grace period.
	Stopped bool
}

// Status returns every registered resource, sorted by name, with its devices
// sorted by ID and its plugin instances sorted by socket. Safe before Start
// and after Stop. It is an addition of devmgr; the kubelet has no equivalent.
func (m *ManagerImpl) Status() []ResourceStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]ResourceStatus, 0, len(m.core.resources))
	for name, r := range m.core.resources {
		if !r.registered {
			continue
		}
		rs := ResourceStatus{
			Name:                   name,
			Capacity:               r.capacityLen(),
			Allocatable:            r.healthyLen(),
			Allocated:              m.core.ledger.AllocatedCount(name),
			Free:                   m.core.free(r).Len(),
			RestoredFromCheckpoint: !r.listed,
		}
		if len(r.devices) > 0 {
			rs.Devices = make([]DeviceStatus, 0, len(r.devices))
		}
		for _, dev := range r.sortedDevices() {
			d, id := dev.dev, dev.id
			health := d.GetHealth()
			if health == pluginapi.Healthy && !r.isHealthy(id) {
				health = pluginapi.Unhealthy // the plugin is gone
			}
			ds := DeviceStatus{ID: id, Health: health, Allocated: m.core.ledger.IsAllocated(name, id)}
			if ds.Allocated {
				ds.Claimed = slices.ContainsFunc(m.core.ledger.Owners(name, id), func(o podstate.ContainerRef) bool { return isClaim(o.PodUID) })
			}
			for _, n := range d.GetTopology().GetNodes() {
				if n != nil {
					ds.NUMANodes = append(ds.NUMANodes, n.ID)
				}
			}
			rs.Devices = append(rs.Devices, ds)
		}
		for socket, in := range r.instances {
			rs.Endpoints = append(rs.Endpoints, endpointStatus(name, socket, in.ep.Options(), in.ep.IsStopped()))
		}
		if p := r.primary; p != nil && !r.current(p) {
			rs.Endpoints = append(rs.Endpoints, endpointStatus(name, p.SocketPath(), p.Options(), true))
		}
		slices.SortFunc(rs.Endpoints, func(a, b EndpointStatus) int { return strings.Compare(a.Socket, b.Socket) })
		out = append(out, rs)
	}
	slices.SortFunc(out, func(a, b ResourceStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func endpointStatus(resource, socket string, o *pluginapi.DevicePluginOptions, stopped bool) EndpointStatus {
	return EndpointStatus{
		Resource:                        resource,
		Socket:                          socket,
		PreStartRequired:                o.GetPreStartRequired(),
		GetPreferredAllocationAvailable: o.GetGetPreferredAllocationAvailable(),
		Stopped:                         stopped,
	}
}
