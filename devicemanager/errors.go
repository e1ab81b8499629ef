package devicemanager

import (
	"errors"

	"github.com/openkubelet/devmgr/endpoint"
	"github.com/openkubelet/devmgr/podstate"
)

// Sentinel errors. Every error Allocate and GetDeviceRunContainerOptions return
// for a refused admission wraps one of them (test with errors.Is); the message
// itself keeps the kubelet's text, which operators grep for.
var (
	// ErrUnregisteredResource: "cannot allocate unregistered device <res>".
	ErrUnregisteredResource = podstate.ErrUnregisteredResource
	// ErrNoHealthyDevices: "no healthy devices present; cannot allocate
	// unhealthy devices <res>".
	ErrNoHealthyDevices = podstate.ErrNoHealthyDevices
	// ErrAllocatedDeviceUnhealthy: "previously allocated devices are no longer
	// healthy; cannot allocate unhealthy devices <res>".
	ErrAllocatedDeviceUnhealthy = podstate.ErrAllocatedDeviceUnhealthy
	// ErrPluginNotReady: the resource is known but no plugin serves it yet:
	// no plugin instance is connected and the grace period since the last
	// one left is not over (after a restart, every resource the checkpoint
	// names starts so), or an instance is connected but has sent no device
	// list since. It is transient: the caller may retry, or have Allocate
	// wait for the plugin (Options.PluginWaitTimeout). The message is the
	// kubelet's for the same refusal ("no healthy devices present; cannot
	// allocate unhealthy devices <res>", or "cannot allocate unregistered
	// device <res>" for a resource only a connected plugin announced)
	// followed by ": device plugin not ready (<why>)". It matches neither
	// ErrNoHealthyDevices (a connected plugin listed no healthy device) nor
	// ErrUnregisteredResource (no plugin is known for the resource).
	ErrPluginNotReady = errors.New("device plugin not ready")
	// ErrInsufficientDevices: "requested number of devices unavailable for
	// <res>. Requested: N, Available: M".
	ErrInsufficientDevices = podstate.ErrInsufficientDevices
	// ErrRequestChanged: "pod <uid> container <name> changed request for
	// resource <res> from N to M".
	ErrRequestChanged = podstate.ErrRequestChanged
	// ErrUnknownPlugin: the resource has no plugin endpoint ("unknown Device
	// Plugin <res>", "endpoint not found in cache for a registered resource:
	// <res>").
	ErrUnknownPlugin = errors.New("unknown device plugin")
	// ErrEndpointStopped: the resource's plugin is gone ("endpoint <res>
	// (<socket>) has been stopped").
	ErrEndpointStopped = endpoint.ErrStopped
	// ErrPluginCall: a plugin RPC failed, timed out or answered garbage; the
	// gRPC error is wrapped too.
	ErrPluginCall = errors.New("device plugin call failed")
	// ErrStopped: the manager is stopped.
	ErrStopped = errors.New("device manager is stopped")
	// ErrCheckpoint: the checkpoint could not be written, so the admission
	// that needed it was undone (the previous file is intact).
	ErrCheckpoint = errors.New("device manager checkpoint write failed")
	// ErrPluginLimit: a plugin was refused or disconnected for going over
	// one of the limits in Options (MaxResources, MaxInstancesPerResource,
	// MaxDevicesPerResource); the message names the resource, the limit and
	// the count.
	ErrPluginLimit = errors.New("device plugin over a limit")
	// ErrInvalidRequest: the pod or container cannot be admitted as given
	// (nil, or a UID or name that is not UTF-8).
	ErrInvalidRequest = errors.New("invalid admission request")
	// ErrSocketInUse: Start found SocketDir in use, by a running kubelet
	// (kubelet.sock accepts connections) or another device manager (it holds
	// the directory's lock); the message names the path. Start touched
	// nothing there.
	ErrSocketInUse = errors.New("device plugin socket directory in use")
)

// admissionError carries the kubelet's message and wraps a sentinel and,
// optionally, the underlying cause.
type admissionError struct {
	msg      string
	sentinel error
	cause    error
}

func (e *admissionError) Error() string { return e.msg }

func (e *admissionError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.sentinel}
	}
	return []error{e.sentinel, e.cause}
}

// pluginCallError wraps a failed RPC: the message is msg followed by the
// cause, and both ErrPluginCall and the cause match.
func pluginCallError(msg string, cause error) error {
	if errors.Is(cause, endpoint.ErrStopped) {
		return cause
	}
	return &admissionError{msg: msg + cause.Error(), sentinel: ErrPluginCall, cause: cause}
}
