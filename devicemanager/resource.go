package devicemanager

import (
	"slices"

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
	// devices is the last list any instance reported, each device once
	// (the last one listed under its ID), and index the position of each
	// ID in it. healthy[i] says whether devices[i]'s Health is exactly
	// "Healthy": a device counts as healthy when it is, the resource is
	// registered and its plugin is not gone (down); every other device
	// counts as unhealthy. healthyN is the number of healthy flags. A
	// health flip changes a device and its flag at a known position; the
	// index changes only with the set of IDs.
	devices  []*pluginapi.Device
	index    idIndex
	healthy  []bool
	healthyN int
	// down: the plugin is gone; every device counts as unhealthy until the
	// next list.
	down bool
	// order is devices' positions in ID order and sortedIDs the IDs in that
	// order, nil when stale; healthySorted caches the sorted healthy IDs
	// for the checkpoint, nil when stale. An update in place keeps order
	// and sortedIDs.
	order         []int32
	sortedIDs     []string
	healthySorted []string
	// seen remembers the healthy flags of the last two healthy sets sorted
	// for this list, newest first, with their sorted IDs: a device that
	// flaps back to an earlier health finds its set here for the price of
	// comparing flags, and the checkpoint's encoder gets the very slice it
	// saw before. Cleared with the list's positions.
	seen [2]healthyMemo
	// alt[i] is the device devices[i] replaced on its last health flip
	// from a borrowed list, with the stored topology: the flip back takes
	// it again instead of a copy. Allocated on the first such flip and
	// dropped with the list's positions.
	alt []*pluginapi.Device
	// census counts the devices per NUMA node set for topology hints; nil
	// when stale (built on the next request, then kept up to date as
	// devices are allocated and released).
	census *topology.Census
	// inOrder: devices is the last list exactly as the plugin sent it (no
	// nil, no repeated ID), its devices counting as healthy exactly when
	// their Health says so (the plugin is not gone, the resource not
	// retired). A plugin resends its whole list on every change, nearly
	// always in the same order: an update that lists the same IDs in that
	// order is applied in place, in one pass with no map built or written
	// (see updateInPlace).
	inOrder bool
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
	}
}

// healthyLen returns the number of devices that count as healthy.
func (r *resourceState) healthyLen() int {
	if !r.registered || r.down {
		return 0
	}
	return r.healthyN
}

// capacityLen returns the number of devices that count in capacity.
func (r *resourceState) capacityLen() int {
	if !r.registered {
		return 0
	}
	return len(r.devices)
}

// unhealthyLen returns the number of devices that count as unhealthy.
func (r *resourceState) unhealthyLen() int { return r.capacityLen() - r.healthyLen() }

// isHealthy reports whether device id counts as healthy.
func (r *resourceState) isHealthy(id string) bool {
	if !r.registered || r.down {
		return false
	}
	i, ok := r.index.find(r.devices, id)
	return ok && r.healthy[i]
}

// device returns the device listed under id; nil if none is.
func (r *resourceState) device(id string) *pluginapi.Device {
	if i, ok := r.index.find(r.devices, id); ok {
		return r.devices[i]
	}
	return nil
}

// byID yields every device with its ID.
func (r *resourceState) byID(yield func(string, *pluginapi.Device) bool) {
	for _, d := range r.devices {
		if !yield(d.ID, d) {
			return
		}
	}
}

// healthyDevices yields the devices that count as healthy, in no order.
func (r *resourceState) healthyDevices(yield func(string, *pluginapi.Device) bool) {
	if r.healthyLen() == 0 {
		return
	}
	for i, d := range r.devices {
		if r.healthy[i] && !yield(d.ID, d) {
			return
		}
	}
}

// healthySet presents the devices of r that count as healthy as a set.
type healthySet struct{ r *resourceState }

func (h healthySet) Len() int           { return h.r.healthyLen() }
func (h healthySet) Has(id string) bool { return h.r.isHealthy(id) }

// resourceLocked returns the record of name, creating it. Expects m.mu held.
func (m *ManagerImpl) resourceLocked(name string) *resourceState {
	r := m.resources[name]
	if r == nil {
		r = newResource(name)
		m.resources[name] = r
	}
	return r
}

// sortedHealthy returns the healthy IDs in order; the slice is shared and must
// not be modified. It filters the sorted list of all IDs, which is sorted
// again only when the list changes other than in place (health flips cost
// no sort), reading the health flags through order: no set lookup, and no
// visit to each device through its pointer.
func (r *resourceState) sortedHealthy() []string {
	if r.healthySorted != nil {
		return r.healthySorted
	}
	if r.healthyLen() == 0 {
		r.healthySorted = []string{}
		return r.healthySorted
	}
	if ids := r.recallHealthy(); ids != nil {
		r.healthySorted = ids
		return ids
	}
	r.sortDevices()
	// Every device healthy (a first list, usually): the sorted IDs are the
	// set, and sharing them saves a copy of every ID.
	out := r.sortedIDs
	if r.healthyLen() < len(r.devices) {
		out = make([]string, 0, r.healthyLen())
		for k, i := range r.order {
			if r.healthy[i] {
				out = append(out, r.sortedIDs[k])
			}
		}
	}
	r.rememberHealthy(out)
	r.healthySorted = out
	return out
}

// healthyMemo is a healthy set of a resource's list: a copy of its flags
// and its IDs in order.
type healthyMemo struct {
	flags []bool
	ids   []string
}

// recallHealthy returns the sorted IDs remembered for the current flags,
// moving them first in seen; nil if seen does not have them.
func (r *resourceState) recallHealthy() []string {
	for i, m := range r.seen {
		if m.ids != nil && slices.Equal(m.flags, r.healthy) {
			r.seen[0], r.seen[i] = m, r.seen[0]
			return m.ids
		}
	}
	return nil
}

// rememberHealthy records ids as the sorted IDs of the current flags; the
// memo it evicts lends its flags' memory.
func (r *resourceState) rememberHealthy(ids []string) {
	flags := append(r.seen[1].flags[:0], r.healthy...)
	r.seen[0], r.seen[1] = healthyMemo{flags: flags, ids: ids}, r.seen[0]
}

// forgetPositions drops what holds for the list's positions only: the
// order, the remembered healthy sets and the replaced devices.
func (r *resourceState) forgetPositions() {
	r.order, r.sortedIDs = nil, nil
	r.seen = [2]healthyMemo{}
	r.alt = nil
}

// sortedDeviceIDs returns the IDs of all devices in order; the slice is
// shared and must not be modified.
func (r *resourceState) sortedDeviceIDs() []string {
	r.sortDevices()
	return r.sortedIDs
}

// sortDevices makes order and sortedIDs describe devices, unless they
// already do.
func (r *resourceState) sortDevices() {
	if r.order == nil || r.sortedIDs == nil {
		r.order, r.sortedIDs = sortByID(deviceIDs(r.devices))
	}
}

// unsortedList returns devices and a copy of their IDs when they need
// sorting (a list whose IDs changed), for sortByID outside the lock; nil
// otherwise.
func (r *resourceState) unsortedList() ([]*pluginapi.Device, []string) {
	if len(r.devices) == 0 || (r.order != nil && r.sortedIDs != nil) {
		return nil, nil
	}
	return r.devices, deviceIDs(r.devices)
}

// adoptOrder installs an order sorted outside the lock for list, if list is
// still devices (updates in place keep it, with its IDs and their order)
// and nobody sorted it meanwhile.
func (r *resourceState) adoptOrder(list []*pluginapi.Device, order []int32, ids []string) {
	if len(list) == 0 || len(r.devices) != len(list) || &r.devices[0] != &list[0] {
		return
	}
	if r.order == nil || r.sortedIDs == nil {
		r.order, r.sortedIDs = order, ids
	}
}

// setDevices replaces the device list with devs and returns the IDs whose
// health changed or that are new (the kubelet notifies their owners), in no
// particular order, and whether the healthy set changed. It costs one pass
// over the list; the IDs are sorted again only when their set changed.
func (r *resourceState) setDevices(devs []*pluginapi.Device) (changed []string, healthyChanged bool) {
	return r.applyList(devs, false)
}

// setBorrowedDevices is setDevices for a list whose devices the caller keeps
// and may change later: the devices it stores are copies, so that what the
// resource holds never changes behind its back.
func (r *resourceState) setBorrowedDevices(devs []*pluginapi.Device) (changed []string, healthyChanged bool) {
	return r.applyList(devs, true)
}

func (r *resourceState) applyList(devs []*pluginapi.Device, borrowed bool) (changed []string, healthyChanged bool) {
	if changed, healthyChanged, ok := r.updateInPlace(devs, borrowed); ok {
		return changed, healthyChanged
	}
	if borrowed {
		owned := make([]*pluginapi.Device, len(devs))
		for i, d := range devs {
			owned[i] = cloneDevice(d)
		}
		devs = owned
	}
	index, list := indexList(devs)
	if len(r.devices) == 0 && len(list) > 0 {
		changed = make([]string, 0, len(list)) // every device is new
	}
	healthy := make([]bool, len(list))
	healthyN := 0
	sameIDs := len(list) == len(r.devices)
	for i, d := range list {
		prev := r.device(d.ID)
		if prev == nil {
			sameIDs = false
		}
		if prev == nil || prev.Health != d.Health {
			changed = append(changed, d.ID)
		}
		if d.Health == pluginapi.Healthy {
			healthy[i] = true
			healthyN++
		}
	}
	// The healthy set changed iff its size did or some device entered or
	// left it; a device that did either is new or changed health, unless
	// its plugin was gone (markUnhealthy), which changes the size.
	healthyChanged = !r.registered || healthyN != r.healthyLen()
	for _, id := range changed {
		if healthyChanged {
			break
		}
		i, _ := index.find(list, id)
		healthyChanged = healthy[i] != r.isHealthy(id)
	}
	r.devices, r.index, r.healthy, r.healthyN, r.down = list, index, healthy, healthyN, false
	r.inOrder = len(list) == len(devs)
	r.forgetPositions()
	r.census = nil
	if healthyChanged || !sameIDs {
		r.healthySorted = nil
	}
	r.registered = true
	r.listed = true
	return changed, healthyChanged
}

// updateInPlace applies devs when it lists the same IDs as devices, in the
// same order (inOrder): only the devices whose health or topology differ are
// replaced, and only those whose health differs change the healthy count
// and are returned in changed. ok is false, and nothing is touched, when
// the list differs in any other way.
func (r *resourceState) updateInPlace(devs []*pluginapi.Device, borrowed bool) (changed []string, healthyChanged bool, ok bool) {
	if !r.inOrder || !r.listed || len(devs) != len(r.devices) {
		return nil, false, false
	}
	var diff []int
	for i, d := range devs {
		prev := r.devices[i]
		if d == nil || d.ID != prev.ID {
			return nil, false, false
		}
		if d != prev && (d.Health != prev.Health || !sameTopology(d.Topology, prev.Topology)) {
			diff = append(diff, i)
		}
	}
	healthyChanged = !r.registered
	topologyChanged := false
	for _, i := range diff {
		d, prev := devs[i], r.devices[i]
		sameNodes := sameTopology(d.Topology, prev.Topology)
		switch {
		case borrowed && sameNodes && sameShape(d.Topology, prev.Topology):
			// A health flip: the device it replaced last time if that has
			// this health, else a copy sharing the stored topology, which
			// the manager never changes.
			d = r.flipped(i, prev, d.Health)
		case borrowed:
			d = cloneDevice(d)
		}
		r.devices[i] = d
		r.healthy[i] = d.Health == pluginapi.Healthy
		// The census counts every device by its nodes, unhealthy ones too.
		if !sameNodes {
			topologyChanged = true
		}
		if d.Health == prev.Health {
			continue
		}
		changed = append(changed, d.ID)
		if nowHealthy := d.Health == pluginapi.Healthy; nowHealthy != (prev.Health == pluginapi.Healthy) {
			healthyChanged = true
			if nowHealthy {
				r.healthyN++
			} else {
				r.healthyN--
			}
		}
	}
	if healthyChanged || topologyChanged {
		r.census = nil
	}
	if healthyChanged {
		r.healthySorted = nil
	}
	r.registered = true
	return changed, healthyChanged, true
}

// flipped returns the device to store at i in place of prev, whose health
// alone changes, to health: the device prev replaced, if it has that health
// and prev's topology, else a new one. prev is kept for the flip back.
func (r *resourceState) flipped(i int, prev *pluginapi.Device, health string) *pluginapi.Device {
	if r.alt == nil {
		r.alt = make([]*pluginapi.Device, len(r.devices))
	}
	d := r.alt[i]
	if d == nil || d.Health != health || d.Topology != prev.Topology || d.ID != prev.ID {
		d = &pluginapi.Device{ID: prev.ID, Health: health, Topology: prev.Topology}
	}
	r.alt[i] = prev
	return d
}

// cloneDevice copies the fields of d the manager reads (nil stays nil).
func cloneDevice(d *pluginapi.Device) *pluginapi.Device {
	if d == nil {
		return nil
	}
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
// order (nil and empty alike).
func sameTopology(a, b *pluginapi.TopologyInfo) bool {
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

// sameShape reports whether a and b are nil alike and so are their node
// lists: with sameTopology, whether a copy of one is a copy of the other.
func sameShape(a, b *pluginapi.TopologyInfo) bool {
	return (a == nil) == (b == nil) && (a.GetNodes() == nil) == (b.GetNodes() == nil)
}

// markUnhealthy moves every healthy device to unhealthy: the plugin is gone,
// its devices still count in capacity but not in allocatable.
func (r *resourceState) markUnhealthy() {
	r.inOrder = false
	had := r.healthyLen()
	r.down = true
	if had == 0 {
		return
	}
	r.healthySorted = nil
	r.census = nil
}

// allocatedChanged keeps the census of the device's resource up to date when
// the ledger allocates or frees a device. Called by the ledger, with m.mu
// held.
func (m *ManagerImpl) allocatedChanged(resource, id string, allocated bool) {
	if r := m.resources[resource]; r != nil && r.census != nil && r.isHealthy(id) {
		r.census.SetAvailable(id, !allocated)
	}
}

// censusLocked returns r's census, building it if stale. Expects m.mu held.
func (m *ManagerImpl) censusLocked(r *resourceState) *topology.Census {
	if r.census == nil {
		r.census = topology.CountDevices(r.byID, len(r.devices), func(id string) bool {
			return r.isHealthy(id) && !m.ledger.IsAllocated(r.name, id)
		})
	}
	return r.census
}
