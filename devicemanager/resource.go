package devicemanager

import (
	"slices"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/endpoint"
	"github.com/openkubelet/devmgr/topology"
)

// resourceState is everything the manager knows about one resource: its plugin
// instances, its devices and their health. One record instead of the kubelet's
// parallel maps.
type resourceState struct {
	name string
	// instances are the connected plugin instances, by socket path.
	instances map[string]*instance
	// primary serves the allocation RPCs: the newest registration, or the
	// last instance that was connected (then stopped). nil only for a record
	// created by a registration whose first message has not come yet.
	primary *endpoint.Endpoint
	// registered: a plugin reported a device list, or the checkpoint named
	// the resource. Only registered resources count as device-plugin
	// resources and appear in capacity.
	registered bool
	// listed: some instance reported a device list (possibly empty).
	listed bool
	// down: the plugin is gone; every device counts as unhealthy until the
	// next list.
	down bool
	// devices is the last list any instance reported, each ID once (the
	// last device listed under it), in ID order once sorted is set; index
	// holds each ID's position in it. A device counts as healthy when its
	// Health is exactly "Healthy", the resource is registered and its
	// plugin is not down; healthy is the number of devices whose Health is
	// "Healthy".
	devices []device
	index   map[string]int
	sorted  bool
	healthy int
	// census counts the devices per NUMA node set for topology hints; nil
	// when the devices or their health changed since it was built.
	census *topology.Census
}

// device is one device of a resource's list.
type device struct {
	id      string // dev.ID
	dev     *pluginapi.Device
	healthy bool // dev.Health == "Healthy"
}

// instance is one connected plugin instance; seq orders registrations.
type instance struct {
	ep  *endpoint.Endpoint
	seq uint64
}

// served reports whether the resource counts against MaxResources: an
// instance is connected, or it is registered (until GetCapacity removes it).
func (r *resourceState) served() bool {
	return r.registered || len(r.instances) > 0
}

// ready reports whether the resource can serve admissions: an instance is
// connected and a device list came since the last time none was.
func (r *resourceState) ready() bool {
	return len(r.instances) > 0 && r.listed && !r.down
}

// listsNothing reports whether the resource is ready and its plugin lists
// no device at all.
func (r *resourceState) listsNothing() bool {
	return r.ready() && len(r.devices) == 0
}

// current reports whether ep is the connected instance on its socket.
func (r *resourceState) current(ep *endpoint.Endpoint) bool {
	in := r.instances[ep.SocketPath()]
	return in != nil && in.ep == ep
}

func newResource(name string) *resourceState {
	return &resourceState{name: name, instances: map[string]*instance{}}
}

// healthyLen returns the number of devices that count as healthy.
func (r *resourceState) healthyLen() int {
	if !r.registered || r.down {
		return 0
	}
	return r.healthy
}

// capacityLen returns the number of devices that count in capacity.
func (r *resourceState) capacityLen() int {
	if !r.registered {
		return 0
	}
	return len(r.devices)
}

// isHealthy reports whether device id counts as healthy.
func (r *resourceState) isHealthy(id string) bool {
	i, ok := r.index[id]
	return ok && r.registered && !r.down && r.devices[i].healthy
}

// device returns the device listed under id; nil if none is.
func (r *resourceState) device(id string) *pluginapi.Device {
	if i, ok := r.index[id]; ok {
		return r.devices[i].dev
	}
	return nil
}

// byID yields every device with its ID.
func (r *resourceState) byID(yield func(string, *pluginapi.Device) bool) {
	for _, d := range r.devices {
		if !yield(d.id, d.dev) {
			return
		}
	}
}

// sortedDevices returns the devices in ID order; the slice is the
// resource's. A list with new IDs is sorted here, on first use (usually the
// next checkpoint write), rather than as it is applied.
func (r *resourceState) sortedDevices() []device {
	if !r.sorted {
		slices.SortFunc(r.devices, func(a, b device) int { return strings.Compare(a.id, b.id) })
		for i, d := range r.devices {
			r.index[d.id] = i
		}
		r.sorted = true
	}
	return r.devices
}

// sortedHealthy returns a new list of the IDs of the devices that count as
// healthy, in order.
func (r *resourceState) sortedHealthy() []string {
	out := make([]string, 0, r.healthyLen())
	if r.healthyLen() == 0 {
		return out
	}
	for _, d := range r.sortedDevices() {
		if d.healthy {
			out = append(out, d.id)
		}
	}
	return out
}

// setDevices makes devs the resource's device list and returns the IDs of
// the devices that are new or whose health changed (the kubelet notifies
// their owners), and whether the set of devices that count as healthy
// changed. The resource keeps the devices: they must not change afterwards.
func (r *resourceState) setDevices(devs []*pluginapi.Device) (changed []string, healthyChanged bool) {
	wasRegistered, wasDown := r.registered, r.down
	// Plugins resend their whole list on every change, nearly always with
	// the same IDs: such a list is applied in place.
	if known := r.known(devs); known != nil {
		changed, healthyChanged = r.updateInPlace(devs, known)
	} else {
		changed, healthyChanged = r.replace(devs)
	}
	r.registered, r.listed, r.down = true, true, false
	switch {
	case !wasRegistered:
		healthyChanged = true // the resource enters the checkpoint
	case wasDown:
		healthyChanged = r.healthy > 0 // no device counted as healthy
	}
	if healthyChanged {
		r.census = nil
	}
	return changed, healthyChanged
}

// known returns the position of each device of devs, in order, when devs
// lists exactly the resource's devices, each once, and no nil device; nil
// otherwise.
func (r *resourceState) known(devs []*pluginapi.Device) []int {
	if !r.listed || len(devs) != len(r.devices) || len(devs) == 0 {
		return nil
	}
	out := make([]int, len(devs))
	seen := make([]bool, len(r.devices))
	for i, d := range devs {
		if d == nil {
			return nil
		}
		k, ok := r.index[d.ID]
		if !ok || seen[k] {
			return nil
		}
		seen[k] = true
		out[i] = k
	}
	return out
}

// updateInPlace applies devs, whose positions known holds: devices whose
// health or topology differ are replaced.
func (r *resourceState) updateInPlace(devs []*pluginapi.Device, known []int) (changed []string, healthyChanged bool) {
	for i, d := range devs {
		stored := &r.devices[known[i]]
		healthy := d.Health == pluginapi.Healthy
		sameHealth := healthy == stored.healthy && (healthy || d.Health == stored.dev.Health)
		sameNodes := sameTopology(d.Topology, stored.dev.Topology)
		if sameHealth && sameNodes {
			continue
		}
		if !sameNodes {
			r.census = nil
		}
		stored.dev = d
		if sameHealth {
			continue
		}
		changed = append(changed, d.ID)
		if healthy != stored.healthy {
			healthyChanged = true
			stored.healthy = healthy
			if healthy {
				r.healthy++
			} else {
				r.healthy--
			}
		}
	}
	return changed, healthyChanged
}

// replace makes devs the device list, each ID once (the last device listed
// under it), nil devices dropped.
func (r *resourceState) replace(devs []*pluginapi.Device) (changed []string, healthyChanged bool) {
	index := make(map[string]int, len(devs))
	list := make([]device, 0, len(devs))
	for _, d := range devs {
		if d == nil {
			continue
		}
		stored := device{id: d.ID, dev: d, healthy: d.Health == pluginapi.Healthy}
		if i, ok := index[d.ID]; ok {
			list[i] = stored
			continue
		}
		index[d.ID] = len(list)
		list = append(list, stored)
	}
	if len(r.devices) == 0 {
		changed = make([]string, 0, len(list)) // every device is new
	}
	healthy := 0
	for _, d := range list {
		if d.healthy {
			healthy++
		}
		prev := r.device(d.id)
		if prev == nil || prev.Health != d.dev.Health {
			changed = append(changed, d.id)
		}
		if wasHealthy := prev != nil && prev.Health == pluginapi.Healthy; wasHealthy != d.healthy {
			healthyChanged = true
		}
	}
	// A healthy device that left the list changes the set too.
	for _, prev := range r.devices {
		if _, ok := index[prev.id]; !ok && prev.healthy {
			healthyChanged = true
		}
	}
	r.devices, r.index, r.sorted, r.healthy, r.census = list, index, false, healthy, nil
	return changed, healthyChanged
}

// sameTopology reports whether a and b list the same NUMA nodes in the
// same order, a nil and an empty list, and nil entries, told apart.
func sameTopology(a, b *pluginapi.TopologyInfo) bool {
	if (a == nil) != (b == nil) {
		return false
	}
	if a == nil {
		return true
	}
	x, y := a.Nodes, b.Nodes
	if len(x) != len(y) || (x == nil) != (y == nil) {
		return false
	}
	for i := range x {
		if (x[i] == nil) != (y[i] == nil) || x[i].GetID() != y[i].GetID() {
			return false
		}
	}
	return true
}

// markUnhealthy moves every healthy device to unhealthy: the plugin is gone,
// its devices still count in capacity but not in allocatable.
func (r *resourceState) markUnhealthy() {
	r.down = true
	r.census = nil
}
