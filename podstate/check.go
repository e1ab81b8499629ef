package podstate

import "k8s.io/apimachinery/pkg/util/sets"

// RequestCheck is what the kubelet's admission pre-checks need
// about one container's request for one resource.
type RequestCheck struct {
	PodUID, ContainerName, Resource string
	Required                        int              // the container's request
	Held                            sets.Set[string] // Ledger.ContainerDevices; nil: no record
	Registered                      bool             // a device set exists for the resource (healthy may be empty)
	Healthy                         DeviceSet        // healthy device IDs; nil: none
	// AlreadyRunning: the sources are not ready yet and the container was
	// found running at start (a kubelet restart): skip the health checks.
	AlreadyRunning bool
}

// DeviceSet is a set of device IDs; a sets.Set[string] is one.
type DeviceSet interface {
	Len() int
	Has(id string) bool
}

// CheckRequest runs the pre-checks in the kubelet's order and returns how many
// devices remain to pick (0: no selection and no plugin call), or the first
// failure:
//  1. a record whose size differs from Required: ErrRequestChanged;
//  2. AlreadyRunning: 0, nil;
//  3. not Registered: *ResourceError with ErrUnregisteredResource;
//  4. no healthy device: *ResourceError with ErrNoHealthyDevices;
//  5. a held device not healthy: *ResourceError with ErrAllocatedDeviceUnhealthy.
//
// Steps 3-5 run even when nothing is to be picked, as upstream does.
func CheckRequest(c RequestCheck) (needed int, err error) {
	needed = c.Required
	if c.Held != nil {
		if held := c.Held.Len(); held != c.Required {
			return 0, admissionErrorf(ErrRequestChanged, "pod %q container %q changed request for resource %q from %d to %d",
				c.PodUID, c.ContainerName, c.Resource, held, c.Required)
		}
		needed = 0
	}
	if c.AlreadyRunning {
		return 0, nil
	}
	switch {
	case !c.Registered:
		return 0, &ResourceError{Resource: c.Resource, Err: ErrUnregisteredResource}
	case c.Healthy == nil || c.Healthy.Len() == 0:
		return 0, &ResourceError{Resource: c.Resource, Err: ErrNoHealthyDevices}
	}
	for id := range c.Held {
		if !c.Healthy.Has(id) {
			return 0, &ResourceError{Resource: c.Resource, Err: ErrAllocatedDeviceUnhealthy}
		}
	}
	return needed, nil
}
