package podstate

import (
	"fmt"
	"slices"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// ReservationID identifies a pending reservation. The zero value never
// identifies one.
type ReservationID uint64

// reservation is a set of devices picked for one container and resource while
// the plugin's Allocate call is in flight.
type reservation struct {
	ref      ContainerRef
	resource string
	ids      []string // distinct, sorted
}

// Reserve marks ids of resource as in use for (podUID, containerName) until
// Commit or Rollback; DeletePods does not release them. Devices already held
// by the same pod (the reuse pool of its init containers) may be reserved
// again; a device held or reserved by another pod is refused with an error
// wrapping ErrDeviceInUse, and then nothing is reserved.
func (l *Ledger) Reserve(podUID, containerName, resource string, ids []string) (ReservationID, error) {
	for _, id := range ids {
		if other, busy := l.heldByOtherPod(resource, id, podUID); busy {
			return 0, fmt.Errorf("%w: resource %q device %q is held by pod %q",
				ErrDeviceInUse, resource, id, other)
		}
	}
	distinct := slices.Clone(ids)
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)

	l.lastID++
	rid := l.lastID
	l.pending[rid] = &reservation{
		ref:      ContainerRef{PodUID: podUID, ContainerName: containerName},
		resource: resource,
		ids:      distinct,
	}
	for _, id := range distinct {
		h := l.entry(resource, id, true)
		h.reserved = append(h.reserved, rid)
	}
	return rid, nil
}

// heldByOtherPod returns a pod other than podUID that holds or has reserved
// the device.
func (l *Ledger) heldByOtherPod(resource, id, podUID string) (string, bool) {
	h := l.entry(resource, id, false)
	if h == nil {
		return "", false
	}
	for _, o := range h.owners {
		if o.PodUID != podUID {
			return o.PodUID, true
		}
	}
	for _, rid := range h.reserved {
		if p := l.pending[rid].ref.PodUID; p != podUID {
			return p, true
		}
	}
	return "", false
}

// Commit turns the reservation into the container's record for its resource,
// as Insert does: the NUMA map is built from devs (numaMap) and resp is kept
// as the plugin's response. An unknown or finished reservation yields an error
// wrapping ErrUnknownReservation and changes nothing.
func (l *Ledger) Commit(id ReservationID, devs DeviceInstances, resp *pluginapi.ContainerAllocateResponse) error {
	r := l.pending[id]
	if r == nil {
		return fmt.Errorf("%w: %d", ErrUnknownReservation, id)
	}
	// Record first, then release the reservation, so the devices never look free.
	l.put(r.ref, r.resource, newRecord(numaMap(r.ids, devs), resp, nil))
	l.unreserve(id, r)
	return nil
}

// Rollback releases the reservation's devices (those no record holds become
// free). It reports whether the reservation was pending.
func (l *Ledger) Rollback(id ReservationID) bool {
	r := l.pending[id]
	if r == nil {
		return false
	}
	l.unreserve(id, r)
	return true
}

func (l *Ledger) unreserve(id ReservationID, r *reservation) {
	delete(l.pending, id)
	for _, dev := range r.ids {
		h := l.entry(r.resource, dev, false) // present: the reservation holds dev
		h.reserved = slices.DeleteFunc(h.reserved, func(rid ReservationID) bool { return rid == id })
		l.drop(r.resource, dev, h)
	}
}

// Pending returns the number of reservations neither committed nor rolled back.
func (l *Ledger) Pending() int { return len(l.pending) }
