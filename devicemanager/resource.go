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
	// devices is the last list any instance reported, by ID (the last device
	// listed under an ID wins). A device counts as healthy when its Health is
	// exactly "Healthy", the resource is registered and its plugin is not
	// down; healthy is the number of devices whose Health is "Healthy".
	devices map[string]*device
	healthy int
	// sorted holds the devices in ID order; nil when the set of IDs changed
	// since it was sorted.
	sorted []*device
	// lists numbers the lists applied, to tell repeated IDs in a list apart.
	lists uint64
	// census counts the devices per NUMA node set for topology hints; nil
	// when the devices or their health changed since it was built.
	census *topology.Census
}

// device is one device of a resource's list: the map and the sorted list
// share it, so that a new report of the same device updates both.
type device struct {
	dev *pluginapi.Device
	// list is the number of the last list that named the device.
	list uint64
}

// instance is one connected plugin instance; seq orders registrations.
type instance struct {
	ep  *endpoint.Endpoint
	seq uint64
}

// current reports whether ep is the connected instance on its socket.
func (r *resourceState) current(ep *endpoint.Endpoint) bool {
	in := r.instances[ep.SocketPath()]
	return in != nil && in.ep == ep
}

func newResource(name string) *resourceState {
	return &resourceState{
		name:      name,
		instances: map[string]*instance{},
		devices:   map[string]*device{},
	}
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
	d := r.devices[id]
	return d != nil && r.registered && !r.down && d.dev.Health == pluginapi.Healthy
}

// device returns the device listed under id; nil if none is.
func (r *resourceState) device(id string) *pluginapi.Device {
	if d := r.devices[id]; d != nil {
		return d.dev
	}
	return nil
}

// byID yields every device with its ID.
func (r *resourceState) byID(yield func(string, *pluginapi.Device) bool) {
	for id, d := range r.devices {
		if !yield(id, d.dev) {
			return
		}
	}
}

// sortedDevices returns the devices in ID order; the slice is shared and
// must not be modified.
func (r *resourceState) sortedDevices() []*device {
	if r.sorted == nil {
		r.sorted = make([]*device, 0, len(r.devices))
		for _, d := range r.devices {
			r.sorted = append(r.sorted, d)
		}
		slices.SortFunc(r.sorted, func(a, b *device) int { return strings.Compare(a.dev.ID, b.dev.ID) })
	}
	return r.sorted
}

// sortedHealthy returns a new list of the IDs of the devices that count as
// healthy, in order.
func (r *resourceState) sortedHealthy() []string {
	out := make([]string, 0, r.healthyLen())
	if r.healthyLen() == 0 {
		return out
	}
	for _, d := range r.sortedDevices() {
		if d.dev.Health == pluginapi.Healthy {
			out = append(out, d.dev.ID)
		}
	}
	return out
}

// setDevices makes devs the resource's device list and returns the IDs of
// the devices that are new or whose health changed (the kubelet notifies
// their owners), and whether the set of devices that count as healthy
// changed. borrowed says the caller keeps devs and may change them later:
// the resource then stores copies.
func (r *resourceState) setDevices(devs []*pluginapi.Device, borrowed bool) (changed []string, healthyChanged bool) {
	wasRegistered, wasDown := r.registered, r.down
	// Plugins resend their whole list on every change, nearly always with
	// the same IDs: such a list is applied in place.
	if r.sameIDs(devs) {
		changed, healthyChanged = r.updateInPlace(devs, borrowed)
	} else {
		changed, healthyChanged = r.replace(devs, borrowed)
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

// sameIDs reports whether devs lists exactly the IDs of the resource's
// devices, each once, and no nil device.
func (r *resourceState) sameIDs(devs []*pluginapi.Device) bool {
	if !r.listed || len(devs) != len(r.devices) {
		return false
	}
	r.lists++
	for _, d := range devs {
		if d == nil {
			return false
		}
		known := r.devices[d.ID]
		if known == nil || known.list == r.lists {
			return false
		}
		known.list = r.lists
	}
	return true
}

// updateInPlace applies devs, which lists the same IDs (sameIDs): devices
// whose health or topology differ are replaced.
func (r *resourceState) updateInPlace(devs []*pluginapi.Device, borrowed bool) (changed []string, healthyChanged bool) {
	for _, d := range devs {
		known := r.devices[d.ID]
		prev := known.dev
		sameNodes := sameTopology(d.Topology, prev.Topology)
		if d.Health == prev.Health && sameNodes {
			continue
		}
		if !sameNodes {
			r.census = nil
		}
		if borrowed {
			d = cloneDevice(d)
		}
		known.dev = d
		if d.Health == prev.Health {
			continue
		}
		changed = append(changed, d.ID)
		if wasHealthy, isHealthy := prev.Health == pluginapi.Healthy, d.Health == pluginapi.Healthy; wasHealthy != isHealthy {
			healthyChanged = true
			if isHealthy {
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
func (r *resourceState) replace(devs []*pluginapi.Device, borrowed bool) (changed []string, healthyChanged bool) {
	next := make(map[string]*device, len(devs))
	for _, d := range devs {
		if d == nil {
			continue
		}
		if borrowed {
			d = cloneDevice(d)
		}
		next[d.ID] = &device{dev: d}
	}
	healthy := 0
	for id, d := range next {
		isHealthy := d.dev.Health == pluginapi.Healthy
		if isHealthy {
			healthy++
		}
		prev := r.devices[id]
		if prev == nil || prev.dev.Health != d.dev.Health {
			changed = append(changed, id)
		}
		if wasHealthy := prev != nil && prev.dev.Health == pluginapi.Healthy; wasHealthy != isHealthy {
			healthyChanged = true
		}
	}
	// A healthy device that left the list changes the set too.
	if !healthyChanged {
		for id, prev := range r.devices {
			if prev.dev.Health == pluginapi.Healthy && next[id] == nil {
				healthyChanged = true
				break
			}
		}
	}
	r.devices, r.healthy, r.sorted, r.census = next, healthy, nil, nil
	return changed, healthyChanged
}

// cloneDevice copies the fields of d the manager reads.
func cloneDevice(d *pluginapi.Device) *pluginapi.Device {
	c := &pluginapi.Device{ID: d.ID, Health: d.Health}
	if t := d.Topology; t != nil {
		c.Topology = &pluginapi.TopologyInfo{}
		if t.Nodes != nil {
			c.Topology.Nodes = make([]*pluginapi.NUMANode, len(t.Nodes))
			for i, n := range t.Nodes {
				if n != nil {
					c.Topology.Nodes[i] = &pluginapi.NUMANode{ID: n.ID}
				}
			}
		}
	}
	return c
}

// sameTopology reports whether a and b list the same NUMA nodes in the same
// order, nil and empty alike (a copy of either is then equally good).
func sameTopology(a, b *pluginapi.TopologyInfo) bool {
	if (a == nil) != (b == nil) || (a.GetNodes() == nil) != (b.GetNodes() == nil) {
		return false
	}
	an, bn := a.GetNodes(), b.GetNodes()
	if len(an) != len(bn) {
		return false
	}
	for i := range an {
		if (an[i] == nil) != (bn[i] == nil) || an[i].GetID() != bn[i].GetID() {
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

// resourceLocked returns the record of name, creating it. Expects m.mu held.
func (m *ManagerImpl) resourceLocked(name string) *resourceState {
	r := m.resources[name]
	if r == nil {
		r = newResource(name)
		m.resources[name] = r
	}
	return r
}

// censusLocked returns r's census, building it if stale. Expects m.mu held.
func (m *ManagerImpl) censusLocked(r *resourceState) *topology.Census {
	if r.census == nil {
		r.census = topology.CountDevices(r.byID, len(r.devices), r.isHealthy)
	}
	return r.census
}

// freeDevices is a resource's free devices: healthy, and held by no record
// or reservation. Expects m.mu held while it is used.
type freeDevices struct {
	r *resourceState
	m *ManagerImpl
	n int
}

// freeLocked returns r's free devices. Expects m.mu held.
func (m *ManagerImpl) freeLocked(r *resourceState) freeDevices {
	n := r.healthyLen()
	for id := range m.ledger.AllocatedIDs(r.name) {
		if r.isHealthy(id) {
			n--
		}
	}
	return freeDevices{r: r, m: m, n: n}
}

func (f freeDevices) Len() int { return f.n }
func (f freeDevices) Has(id string) bool {
	return f.r.isHealthy(id) && !f.m.ledger.IsAllocated(f.r.name, id)
}
