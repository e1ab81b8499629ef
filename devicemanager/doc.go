// Package devicemanager is the kubelet's Device Manager as a library: the
// kubelet side of the device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1).
//
// ManagerImpl serves the Registration service on SocketDir/kubelet.sock,
// dials every registering plugin back (one endpoint per plugin instance),
// follows each plugin's ListAndWatch stream to keep the healthy and unhealthy
// device sets, allocates devices to containers (init-container reuse,
// sidecars, NUMA alignment, the plugin's preferred allocation,
// PreStartContainer), reports capacity with a grace period for vanished
// plugins, answers topology hints, and keeps every allocation in
// kubelet_internal_checkpoint, a file the kubelet itself reads and writes.
// Method names and meanings follow the kubelet's Manager interface (v1.37).
//
// # A typical embedding
//
//	m, err := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir})
//	err = m.Start(activePods, sourcesReady, nil, nil)
//	defer m.Stop()
//	err = m.Allocate(ctx, pod, &pod.Spec.Containers[0])          // at admission
//	opts, err := m.GetDeviceRunContainerOptions(ctx, pod, &pod.Spec.Containers[0]) // before start
//
// An embedder that relays a plugin's device lists itself, or a test, can hand
// a list to PluginListAndWatchReceiver (the kubelet's method of that name): it
// takes effect, checkpoint included, before the call returns.
//
// # Differences from the kubelet
//
// devmgr fixes bugs users hit upstream: devices picked for an in-flight
// plugin call are reserved until the call ends and never handed out twice;
// admission of a container is all or nothing; every plugin call has a
// deadline and no lock is held across it, so a hung plugin delays only pods
// that need it; a failing GetPreferredAllocation means "no preference"; a
// plugin re-registering on its socket replaces its old connection; the
// checkpoint is written only when its content changes, always with the same
// bytes for the same history, and a corrupt one is moved aside; Updates never
// drops a pod UID; registration endpoints must be bare file names; a device
// list handed to PluginListAndWatchReceiver for a resource no plugin serves is
// ignored. docs/ARCHITECTURE.md lists them all, with the upstream issues.
//
// # Concurrency
//
// Every method of ManagerImpl is safe for concurrent use. One mutex guards
// the manager's state; it is never held across a gRPC call or a disk write.
// Checkpoint writes are serialised by a second lock taken before the first.
//
// # Lifecycle
//
// NewManagerImpl validates options and touches no files. Start reads the
// checkpoint, removes stale sockets and listens. Stop ends every plugin
// stream and the registration server and returns when every goroutine the
// manager started has ended; it is idempotent and safe before Start. A
// stopped manager cannot be started again; its getters keep answering.
package devicemanager
