package devicemanager

import (
	v1 "k8s.io/api/core/v1"

	"github.com/openkubelet/devmgr/pluginwatcher"
	"github.com/openkubelet/devmgr/podstate"
)

// ActivePodsFunc returns the pods that are running or about to run on the node.
// The manager keeps allocations of these pods and drops the others when it
// garbage-collects. It is called without the manager's lock held.
type ActivePodsFunc func() []*v1.Pod

// SourcesReady reports whether the caller has seen every pod source since it
// started. Until it has, the manager neither garbage-collects allocations nor
// re-checks containers that were already running when it started.
type SourcesReady interface{ AllReady() bool }

// ResourceUpdate names pods whose allocated devices changed health.
type ResourceUpdate struct{ PodUIDs []string }

// PluginHandler is the plugin-registry side of registration, the kubelet's
// cache.PluginHandler: what a plugin watcher (package pluginwatcher) calls.
type PluginHandler = pluginwatcher.Handler

// DeviceRunContainerOptions is what the container runtime needs for the devices
// of one container: environment, mounts, device nodes, annotations and CDI
// device names, merged over the container's resources.
type DeviceRunContainerOptions = podstate.RunOptions

// EnvVar is one environment variable of DeviceRunContainerOptions.
type EnvVar = podstate.EnvVar

// Mount is one mount of DeviceRunContainerOptions.
type Mount = podstate.Mount

// DeviceInfo is one device node of DeviceRunContainerOptions.
type DeviceInfo = podstate.DeviceInfo

// Annotation is one annotation of DeviceRunContainerOptions.
type Annotation = podstate.Annotation

// CDIDevice is one CDI device name of DeviceRunContainerOptions.
type CDIDevice = podstate.CDIDevice

// DeviceInstances maps device IDs to devices of one resource.
type DeviceInstances = podstate.DeviceInstances

// ResourceDeviceInstances maps resource names to their devices.
type ResourceDeviceInstances = podstate.ResourceDeviceInstances
