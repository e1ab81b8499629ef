// Package topology holds the NUMA side of the device manager: the node
// bitmask, topology hints, the Census of a device-plugin resource that
// answers its hints and tiers its available devices against a chosen
// affinity, the pod-level request aggregation used by pod-scope hints, and
// NUMA discovery from sysfs. The topology manager's policies and affinity
// Store, which consume these hints, are package topology/policy.
//
// # Behaviour
//
// It follows the kubelet v1.37 device manager's hint generation and aligned
// allocation:
//
//   - BitMask is a uint64 set of node ids 0..63 with the kubelet's text
//     form and the operations its users need.
//   - CountDevices counts a resource's devices into a Census, once per
//     change of the devices or their health: devices per distinct node set
//     ("signature"), all and healthy ones.
//   - Census.Hints decides per resource between "no preference" (nil),
//     "impossible" (empty) and the masks that fit, for container and pod
//     scope alike. It costs a step per allocated, reusable and held device,
//     then per mask a step per signature: plugins advertising tens of
//     thousands of devices cost no pass over them. Masks are enumerated only
//     over the nodes that carry devices (2^c - 1 masks for c such nodes), so
//     a device-less node costs nothing; a plugin spreading devices over all
//     of a 34-node machine would still need 2^34 masks, as in the kubelet.
//   - Census.Tiers splits available devices into aligned, unaligned and
//     no-topology tiers, in a deterministic order.
//   - PodRequests aggregates container limits with the sidecar formula.
//   - Discover reads node ids under a sysfs root passed by the caller.
//
// Where the kubelet would panic or is silent, devmgr reads it so:
//   - a device ID the census does not know, a nil device and a nil entry in
//     a node list mean "no topology";
//   - a node id outside 0..63 (negative, 64, 99, ...) is never in a mask: it
//     still makes the resource topology-aware, as upstream, but it is never a
//     candidate node, a device with only such ids counts for no mask, a
//     reusable device with only such ids rejects every mask, and tiering
//     treats such a device as having no topology;
//   - a device given as both available and reusable counts once (the kubelet
//     never passes such sets);
//   - a machine list with no id in 0..63 means "no NUMA information": no
//     preference (nil hints) rather than no placement;
//   - tiers come in a deterministic order rather than as sets.
//
// # Concurrency
//
// The package is pure: no locks, goroutines, clocks or I/O, except
// Discover, which reads the directory it is given. Functions read their
// arguments and never modify or retain them (returned hints point into
// memory of their own). Callers that share device maps or sets with writers
// must hold their own lock across a call. BitMask and Hint are values, safe
// to share read-only. A Census does not change once built.
//
// # Lifecycle
//
// None: there is nothing to start, stop or close.
package topology
