package podstate

import (
	"errors"
	"fmt"
)

// Sentinel errors of admission. Every error CheckRequest and Select return
// matches exactly one of them with errors.Is and prints the kubelet's message
// text, which operators grep for.
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
	// needs.
	ErrInsufficientDevices = errors.New("requested number of devices unavailable")
	// ErrRequestChanged: the container holds a different number of devices
	// than it now requests.
	ErrRequestChanged = errors.New("container changed its device request")
	// ErrAllocationShortfall: the selection tiers did not cover the devices
	// reported available.
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

// admissionError carries the kubelet's text for an admission failure and
// matches its sentinel with errors.Is.
type admissionError struct {
	sentinel error
	text     string
}

func admissionErrorf(sentinel error, format string, args ...any) error {
	return &admissionError{sentinel: sentinel, text: fmt.Sprintf(format, args...)}
}

func (e *admissionError) Error() string        { return e.text }
func (e *admissionError) Is(target error) bool { return target == e.sentinel }
