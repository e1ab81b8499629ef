package podstate

import (
	"errors"
	"fmt"
)

// Sentinel errors of admission. Every error CheckRequest and Select return
// matches exactly one of them with errors.Is; the typed errors below carry the
// details and print the kubelet's message text, which operators grep for.
var (
	// ErrUnregisteredResource: no plugin ever reported devices for the
	// resource. Carried by *ResourceError.
	ErrUnregisteredResource = errors.New("cannot allocate unregistered device")
	// ErrNoHealthyDevices: the resource is registered but has no healthy
	// device. Carried by *ResourceError.
	ErrNoHealthyDevices = errors.New("no healthy devices present; cannot allocate unhealthy devices")
	// ErrAllocatedDeviceUnhealthy: a device the container already holds is no
	// longer healthy. Carried by *ResourceError.
	ErrAllocatedDeviceUnhealthy = errors.New("previously allocated devices are no longer healthy; cannot allocate unhealthy devices")
	// ErrInsufficientDevices: fewer devices are free than the container still
	// needs. Carried by *insufficientDevicesError.
	ErrInsufficientDevices = errors.New("requested number of devices unavailable")
	// ErrRequestChanged: the container holds a different number of devices
	// than it now requests. Carried by *requestChangedError.
	ErrRequestChanged = errors.New("container changed its device request")
	// ErrAllocationShortfall: the selection tiers did not cover the devices
	// reported available. Carried by *shortfallError.
	ErrAllocationShortfall = errors.New("unexpectedly allocated less resources than required")
)

// Ledger errors.
var (
	// ErrUnknownReservation: Commit was given a reservation that is not
	// pending (never made, already committed or rolled back).
	ErrUnknownReservation = errors.New("unknown device reservation")
	// ErrDeviceInUse: Reserve was asked for a device that another pod holds
	// or has reserved.
	ErrDeviceInUse = errors.New("device already in use")
	// ErrNoResponse: a record has no plugin response, so it cannot be written
	// to the checkpoint.
	ErrNoResponse = errors.New("record has no allocate response")
	// ErrUnencodableResponse: a record's plugin response could not be encoded
	// as protobuf, so it cannot be written to the checkpoint.
	ErrUnencodableResponse = errors.New("allocate response cannot be encoded")
	// ErrUndecodableResponse: a checkpoint entry's AllocResp is not a valid
	// ContainerAllocateResponse; the entry was not restored.
	ErrUndecodableResponse = errors.New("allocate response cannot be decoded")
)

// ResourceError reports that a resource cannot serve a request at all. Err is
// ErrUnregisteredResource, ErrNoHealthyDevices or ErrAllocatedDeviceUnhealthy.
type ResourceError struct {
	Resource string
	Err      error
}

// Error returns the kubelet's text, e.g. "cannot allocate unregistered device <resource>".
func (e *ResourceError) Error() string { return e.Err.Error() + " " + e.Resource }

// Unwrap returns the sentinel.
func (e *ResourceError) Unwrap() error { return e.Err }

// requestChangedError reports a container whose recorded device count differs
// from its current request.
type requestChangedError struct {
	PodUID, ContainerName, Resource string
	From, To                        int // recorded count, requested count
}

// Error returns the kubelet's text.
func (e *requestChangedError) Error() string {
	return fmt.Sprintf("pod %q container %q changed request for resource %q from %d to %d",
		e.PodUID, e.ContainerName, e.Resource, e.From, e.To)
}

// Is reports whether target is ErrRequestChanged.
func (e *requestChangedError) Is(target error) bool { return target == ErrRequestChanged }

// insufficientDevicesError reports that fewer devices are available than
// still needed. Requested is what remained to pick after the reuse pool.
type insufficientDevicesError struct {
	Resource             string
	Requested, Available int
}

// Error returns the kubelet's text.
func (e *insufficientDevicesError) Error() string {
	return fmt.Sprintf("requested number of devices unavailable for %s. Requested: %d, Available: %d",
		e.Resource, e.Requested, e.Available)
}

// Is reports whether target is ErrInsufficientDevices.
func (e *insufficientDevicesError) Is(target error) bool { return target == ErrInsufficientDevices }

// shortfallError reports that the selection ran out of candidates although
// enough devices were reported available (the tiers did not cover them).
// Requested is the full request, Got what had been picked. Resource is not
// part of the kubelet's text and is given for context only.
type shortfallError struct {
	Resource       string
	Requested, Got int
}

// Error returns the kubelet's text.
func (e *shortfallError) Error() string {
	return fmt.Sprintf("unexpectedly allocated less resources than required. Requested: %d, Got: %d",
		e.Requested, e.Got)
}

// Is reports whether target is ErrAllocationShortfall.
func (e *shortfallError) Is(target error) bool { return target == ErrAllocationShortfall }
