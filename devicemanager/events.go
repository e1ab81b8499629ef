package devicemanager

import "slices"

// EventKind says what happened to a container's devices.
type EventKind string

const (
	// EventAdmitted means Allocate recorded the container's devices of one
	// resource and the checkpoint holding them is on disk.
	EventAdmitted EventKind = "Admitted"
	// EventReleased means the manager dropped the container's record of one
	// resource. Garbage collection drops every record of a pod at once, so
	// a device an init container handed to a later container of the pod is
	// in the Released event of each: an agent that scrubs devices does so
	// once per device of the pod's events.
	EventReleased EventKind = "Released"
)

// ReleaseReason says why devices were released.
type ReleaseReason string

const (
	// ReleasePodInactive means garbage collection (UpdateAllocatedDevices,
	// which also runs before each admission and before hints) found the pod
	// no longer among the active pods.
	ReleasePodInactive ReleaseReason = "PodInactive"
	// ReleasePodInactiveAtStart means Start, given the active pods, found
	// the pod missing from them when it restored the checkpoint: the pod
	// ended while no manager ran, or a crash cut its admission short. No
	// EventAdmitted of this manager precedes such an event.
	ReleasePodInactiveAtStart ReleaseReason = "PodInactiveAtStart"
)

// Event is one change of what a container holds of one resource.
type Event struct {
	Kind          EventKind
	PodUID        string
	ContainerName string
	ResourceName  string
	// DeviceIDs are the container's devices of the resource, sorted.
	DeviceIDs []string
	// Reason is set for EventReleased only.
	Reason ReleaseReason
}

// Events returns the channel of admissions and releases, one Event per
// container and resource, when Options.Events is set; otherwise nil (a
// channel that never delivers anything).
//
// Every record Allocate makes is reported once as EventAdmitted, and once as
// EventReleased with the same devices when garbage collection drops it. A
// record restored from the checkpoint is reported only when it is released.
// Events of one container come in the order the changes happened, and no
// event is ever dropped or merged with another: unlike Updates, whose
// pending pod UIDs may be merged, each event here is a change an agent may
// act on (reset or scrub a released device).
//
// Some changes produce no event. An allocation undone because its checkpoint
// write failed was never admitted: Allocate returned an error. A resource
// that GetCapacity removes after its grace period releases nothing: its
// allocations stay, as in the kubelet, until their pods go, and are reported
// released then.
//
// The manager never waits for the reader: events wait in a queue without
// bound, and a goroutine hands them to the channel while any are queued.
// Hence a channel, not a callback: a slow callback would hold up admissions.
// Stop closes the channel, as it closes Updates, and changes after Stop are
// not reported. The events the channel had not delivered then are kept, in
// order: UndeliveredEvents returns them, so that a reader that stops reading
// at Stop loses none.
func (m *ManagerImpl) Events() <-chan Event {
	if m.events == nil {
		return nil
	}
	return m.events.Out()
}

// UndeliveredEvents returns, in order, the events that Events() had not
// delivered when Stop closed it: no event is both delivered and returned,
// and every event is one or the other. It returns nil until Stop has
// returned, and when Options.Events is not set; each call returns the same
// events.
func (m *ManagerImpl) UndeliveredEvents() []Event {
	if m.events == nil {
		return nil
	}
	return m.events.Undelivered()
}

// releasedEvents reports what the given pods hold as released; none when
// Events are not reported. The pods' records must still be in the ledger.
func (c *core) releasedEvents(podUIDs []string, reason ReleaseReason) []Event {
	if !c.events {
		return nil
	}
	held := c.ledger.Holdings(podUIDs...)
	evs := make([]Event, len(held))
	for i, h := range held {
		evs[i] = Event{
			Kind: EventReleased, PodUID: h.PodUID, ContainerName: h.ContainerName,
			ResourceName: h.Resource, DeviceIDs: h.DeviceIDs, Reason: reason,
		}
	}
	return evs
}

// admittedEvents reports the container's records of resources as
// admitted; none when Events are not reported. The Allocate call that made
// them is still in progress, so garbage collection cannot have dropped
// them.
func (c *core) admittedEvents(podUID, container string, resources []string) []Event {
	if !c.events {
		return nil
	}
	evs := make([]Event, 0, len(resources))
	for _, res := range resources {
		ids := c.ledger.ContainerDevices(podUID, container, res).UnsortedList()
		slices.Sort(ids)
		evs = append(evs, Event{
			Kind: EventAdmitted, PodUID: podUID, ContainerName: container,
			ResourceName: res, DeviceIDs: ids,
		})
	}
	return evs
}
