package podadmit

import (
	v1 "k8s.io/api/core/v1"

	"github.com/openkubelet/devmgr/topology/policy"
)

// alignment is the topology manager of the node: before a container's
// devices are allocated, the hints of the providers are merged under the
// policy and the chosen NUMA affinity is stored where the device manager
// reads it (its Options.AffinityStore). In the container scope each
// container's hints are merged before its allocation (providers); in the pod
// scope the whole pod's, once, before the first (podProviders). nil: no
// alignment.
type alignment struct {
	store        *policy.Store
	policy       policy.Policy
	podScope     bool
	providers    []policy.HintProvider
	podProviders []policy.PodHintProvider
}

// SetTopology makes every container's admission go through the policy p
// first, as the kubelet's topology manager in its container scope: the hints
// of providers (the device manager, typically) are merged and the chosen
// affinity is recorded in store, which must be the manager's
// Options.AffinityStore. A policy that refuses a container fails the pod's
// admission with a *policy.AffinityError. Call it before the first Admit.
func (adm *Admitter) SetTopology(store *policy.Store, p policy.Policy, providers ...policy.HintProvider) {
	adm.mu.Lock()
	defer adm.mu.Unlock()
	adm.align = &alignment{store: store, policy: p, providers: providers}
}

// SetPodTopology is SetTopology in the kubelet's pod scope: the hints of the
// whole pod (every container's requests together) are merged once, before
// the first container's devices are allocated, and the chosen affinity is
// recorded for every container, so that all of them are aligned to the same
// NUMA nodes. A policy that refuses the pod fails its admission with an
// *AdmitError naming no container, wrapping a *policy.AffinityError. Call it
// before the first Admit; it replaces an earlier SetTopology.
func (adm *Admitter) SetPodTopology(store *policy.Store, p policy.Policy, providers ...policy.PodHintProvider) {
	adm.mu.Lock()
	defer adm.mu.Unlock()
	adm.align = &alignment{store: store, policy: p, podScope: true, podProviders: providers}
}

func (adm *Admitter) alignment() *alignment {
	adm.mu.Lock()
	defer adm.mu.Unlock()
	return adm.align
}

// admitPod merges the pod's hints in the pod scope; nothing in the other.
func (a *alignment) admitPod(pod *v1.Pod) error {
	if a == nil || !a.podScope {
		return nil
	}
	_, err := a.store.AdmitPod(a.policy, pod, a.podProviders...)
	return err
}

// admit merges the container's hints in the container scope; nothing in the
// pod scope, whose affinity admitPod recorded.
func (a *alignment) admit(pod *v1.Pod, c *v1.Container) error {
	if a == nil || a.podScope {
		return nil
	}
	_, err := a.store.Admit(a.policy, pod, c, a.providers...)
	return err
}

func (a *alignment) forget(podUID string) {
	if a != nil {
		a.store.RemovePod(podUID)
	}
}
