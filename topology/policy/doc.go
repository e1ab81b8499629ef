// Package policy is the topology manager of a node: the kubelet's admit
// policies (none, best-effort, restricted and single-numa-node), which merge
// the topology hints that several providers give for a container's resources
// into one NUMA affinity and decide whether the container is admitted, and
// Store, which records the affinity chosen for each container where the
// device manager reads it (a *Store is a topology.AffinityStore, for
// devicemanager.Options.AffinityStore).
//
// The hints, bitmasks and hint generation are package topology's; this
// package only consumes them.
//
// # Behaviour
//
// It follows the kubelet v1.37 topology manager at container scope, with the
// default policy options:
//
//   - New builds a policy by the name the kubelet's --topology-manager-policy
//     flag takes, for a machine's NUMA node ids. Policy.Merge returns the
//     hint and the admission decision of the kubelet's policy of that name
//     for the same providers' hints; Policy lists the rules.
//   - The kubelet reaches that decision by merging every permutation (one
//     hint from each resource's list), whose number is the product of the
//     list sizes (255^4 for four providers on eight nodes,
//     kubernetes#131738), and it refuses machines of more than eight NUMA
//     nodes (max-allowable-numa-nodes) to bound that. Merge instead finds the
//     preferred alignments in one pass over the hints and, only when there is
//     none, folds the resources one at a time keeping the distinct masks
//     reached (merge.go explains why the decision is the same). So New
//     accepts any machine whose node ids are in 0..63.
//   - Store.Admit runs one container admission: it asks every HintProvider
//     (the device manager, a CPU manager) for the container's hints, merges
//     them under a policy and records the result, or returns an
//     *AffinityError, whose message and Reason are the kubelet's. Under the
//     none policy it asks no provider and records nothing.
//   - Store.GetAffinity gives Hint{} (no affinity) for a container it does
//     not know, as the device manager expects when no policy applies.
//
// # Concurrency
//
// A Policy is an immutable value, safe for concurrent use; Merge never
// modifies or retains its argument, and the mask of the hint it returns is
// its own. Store is the one stateful type: its methods take its own lock and
// are safe for concurrent use, and hints are copied in and out. Admit does
// not hold the lock while it asks the providers, so callers admit one
// container at a time, as the kubelet does.
//
// # Lifecycle
//
// A Policy needs none. A Store comes from NewStore (the zero value is not
// usable), gains an entry for every admitted container and loses a pod's
// entries only through RemovePod, which the caller invokes when the pod goes
// away. Nothing starts a goroutine; there is nothing to stop or close.
package policy
