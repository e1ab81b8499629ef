// Package podresources serves the kubelet's PodResourcesLister v1 API
// (k8s.io/kubelet/pkg/apis/podresources/v1) from a device manager: the API
// that monitoring agents, NUMA-aware schedulers' node agents and device
// exporters read to learn which devices each container holds.
//
// A Server answers the three methods of the service:
//
//   - List: every pod of the PodSource, in its order, with its restartable
//     init containers (sidecars) and then its regular containers, in spec
//     order, each with the devices allocated to it. Regular init containers
//     are not reported (their devices pass to the containers that reuse
//     them). A device allocated before it turned unhealthy is still reported
//     for its container. When the DeviceSource also implements
//     AllocationUpdater (ManagerImpl does), List first lets it drop the
//     allocations of pods that are gone, as the kubelet does.
//   - GetAllocatableResources: every healthy device, allocated or not, and
//     never an unhealthy one.
//   - Get: one pod, by namespace and name, as List reports it; an unknown pod
//     fails with codes.NotFound ("pod NAME in namespace NS not found").
//
// Devices are reported the kubelet's way: one ContainerDevices per
// (resource, device, NUMA node), with one device ID and a single-node
// topology, or one without topology for a device that reports no NUMA node.
// Unlike the kubelet, devmgr sorts them (by resource, device ID, node), so
// equal states give equal answers. CPU IDs, memory and dynamic resources are
// always empty: devmgr has no CPU, memory or DRA manager.
//
// # A typical embedding
//
//	srv, err := podresources.NewServer(mgr, podresources.PodsFunc(activePods), podresources.Options{})
//	err = srv.Start(filepath.Join(podresources.DefaultSocketDir, podresources.SocketName))
//	defer srv.Stop()
//
// An embedder with a grpc.Server of its own calls Register instead of Start.
//
// # Differences from the kubelet
//
// Get answers codes.NotFound for an unknown pod, where the kubelet answers
// codes.Unknown with the same text. A device whose topology lists no NUMA
// node is reported without topology (the kubelet leaves it out of
// GetAllocatableResources while List reports it). The kubelet's server sets
// no send limit; devmgr's refuses a response larger than
// Options.MaxSendMsgSize (16 MiB by default, the clients' customary receive
// limit) with codes.ResourceExhausted. The kubelet always rate-limits
// (DefaultQPS calls per second, burst DefaultBurst); devmgr does when
// Options.Limiter is set, as "devmgr serve" does by default. A call the
// limiter refuses counts in the kubelet's metrics as a request and an error
// of its method; the kubelet refuses it before counting anything.
//
// # Concurrency
//
// Every method of Server is safe for concurrent use. Calls take no lock of
// the Server: they read the DeviceSource and the PodSource, which must be
// safe for concurrent use themselves, and never modify what those return.
//
// # Lifecycle
//
// NewServer validates its arguments and touches no files. Start creates the
// socket's directory if missing, replaces a stale socket (never a file that
// is not a socket, never a socket in use), listens and serves in a goroutine.
// Stop closes every connection, waits for calls in progress and the serving
// goroutine, and removes the socket if it is still the file Start created; it
// is idempotent and safe before Start. A stopped Server cannot be started
// again. The Server never stops its sources.
package podresources
