// Package podadmit admits whole pods through a device manager in the
// kubelet's order, and releases them.
//
// The kubelet admits a pod through its container manager's admission
// handler (the topology manager): for every init container in spec order,
// regular and restartable alike, then every app container, it merges the
// hints of the container's resources under the topology policy and calls
// the device manager's Allocate. devicemanager.ManagerImpl.Allocate expects
// exactly that order, and Admitter.Admit keeps it:
//
//   - A regular init container has finished when the next container starts,
//     so its devices may be taken again by the containers after it, sidecars
//     included.
//   - A restartable init container (a sidecar: RestartPolicy Always) runs
//     beside the app containers, so it keeps its devices: no later container
//     is given them.
//   - The manager keeps these reusable devices for one pod, the pod being
//     admitted. The kubelet admits one pod at a time; so does an Admitter.
//     A pod whose plugin is not ready yet waits for it (the manager's
//     Options.PluginWaitTimeout) before its turn, holding up no other pod.
//
// The topology policy runs in the container scope (SetTopology: each
// container's hints merged before its allocation) or in the pod scope
// (SetPodTopology: the whole pod's hints merged once, the one affinity given
// to every container), as the kubelet's --topology-manager-scope.
//
// Admission is all or nothing: when a container is refused, by the policy or
// by the manager, what the pod's earlier containers got is released before
// Admit returns. Release frees an admitted pod's devices.
//
// An Admitter is also the manager's view of which pods are active: pass its
// ActivePods to the manager's Start (and to a podresources server), so that
// garbage collection keeps the devices of admitted pods and of pods being
// admitted, and frees those of released ones.
//
// AdmittedPods and Restore are what a process that restarts needs: it saves
// AdmittedPods, and after the restart it hands them to Restore, which takes
// the pods back without allocating anything (their devices are what the
// manager restored from its checkpoint) and rebuilds each pod's answer. The
// kubelet does the same with the pods its sources give it after a restart.
// They are exported because every embedder that outlives a restart needs
// them, as devmgr's own serve command does.
//
// An Admitter is safe for concurrent use. It starts nothing; its lifecycle
// is the manager's.
package podadmit
