// Package nodee2e runs device plugins on a real node: etcd, kube-apiserver
// and kube-scheduler, containerd with runc and a bridge network, and the
// kubelet, first the stock kubelet, then make kubelet's, with devmgr as its
// device manager. The same scenarios, with the same assertions, run on
// both: registration and capacity, a pod whose container sees what the
// plugins' Allocate and CDI specs give, pods that do not fit, unhealthy
// devices, kubelet and plugin restarts, a container restart, a plugin not
// back, a pod deleted while the kubelet is down, init and sidecar
// containers, a pod with a ResourceClaim that devmgr serve --dra, running
// beside the kubelet, publishes and prepares for the kubelet's own DRA
// manager, and a pod asking for the same plugin's resource as an extended
// resource, served through DRA; then running pods move between the two
// kubelets on one node.
//
// The tests run as root with `make node-e2e`, which writes
// docs/NODE-E2E.md from the run. The node lives in fresh mount, network and
// PID namespaces; nothing is written to the host's /var/lib/kubelet, the
// run's directory and cgroups are removed when it ends, and the kernel
// tunables the kubelet sets at start, which no namespace confines, are
// put back. The components are
// built once into the cache of make e2e ($DEVMGR_E2E_CACHE, else
// devmgr/e2e in the user's cache directory), under their versions' names.
package nodee2e
