// Package topology holds the NUMA side of the device manager: the node
// bitmask, topology hints, hint generation for a device-plugin resource,
// the tiering of available devices against a chosen affinity, the pod-level
// request aggregation used by pod-scope hints, NUMA discovery from sysfs,
// and the topology-manager policies that merge the hints of several
// providers into an admission decision, with a Store for the chosen
// affinities.
//
// # Behaviour
//
// It follows the kubelet v1.37 (SPEC.md sections 3.5 and 5):
//
//   - BitMask is a uint64 set of node ids 0..63 with the kubelet's operations
//     and text form. IterateBitMasks enumerates subsets the way hint
//     generation needs.
//   - ResourceHints decides per resource between "no preference" (nil),
//     "impossible" (empty) and the hints of GenerateHints, for container and
//     pod scope alike; the caller supplies the device sets.
//   - GenerateHints counts devices per distinct node set ("signature") in one
//     pass and then evaluates each mask over signatures, not devices, so
//     plugins advertising tens of thousands of devices cost one linear pass.
//     Masks are enumerated only over the nodes that carry devices (2^c - 1
//     masks for c such nodes), so a device-less node costs nothing; a plugin
//     spreading devices over all of a 34-node machine would still need 2^34
//     masks, as in the kubelet.
//   - FilterByAffinity splits available devices into aligned, unaligned and
//     no-topology tiers, in a deterministic order.
//   - PodRequests aggregates container limits with the sidecar formula.
//   - Discover reads node ids under a sysfs root passed by the caller.
//   - NewPolicy builds the kubelet's none, best-effort, restricted and
//     single-numa-node policies (default policy options); Policy.Merge
//     returns exactly the kubelet's hint and admission for the same
//     providers' hints. The kubelet enumerates the cross product of every
//     resource's hints (255^4 permutations for four providers on eight
//     nodes, kubernetes#131738); Merge instead finds the preferred
//     alignments in one pass over the hints and, only when there is none,
//     folds the resources one at a time keeping the distinct masks reached
//     (policy_merge.go explains why that is the same decision). So, unlike
//     the kubelet, NewPolicy accepts machines with more than eight NUMA
//     nodes (the kubelet's max-allowable-numa-nodes).
//   - Store records the affinity chosen per container and is the device
//     manager's AffinityStore; Store.Admit runs one container admission
//     against HintProviders, such as the device manager.
//
// Where the kubelet would panic or is silent, devmgr reads it so:
//   - a device ID missing from the device map, a nil device and a nil entry
//     in a node list mean "no topology";
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
// The package is pure: no locks, goroutines, clocks or I/O, except Discover,
// which reads the directory it is given, and Store, the one stateful type,
// whose methods take its own mutex and are safe for concurrent use.
// Functions read their arguments and never modify or retain them (returned
// hints point into memory of their own). Callers that share device maps or
// sets with writers must hold their own lock across a call. BitMask and Hint
// are values, safe to share read-only; a Policy is immutable and safe for
// concurrent use.
//
// # Lifecycle
//
// None: there is nothing to start, stop or close.
package topology
