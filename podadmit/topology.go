package podadmit

import (
	v1 "k8s.io/api/core/v1"

	"github.com/openkubelet/devmgr/topology/policy"
)

// alignment is the topology manager of the node: before a container's
// devices are allocated, the hints of the providers are merged under the
// policy and the chosen NUMA affinity is stored where the device manager
// reads it (its Options.AffinityStore). nil: no alignment.
type alignment struct {
	store     *policy.Store
	policy    policy.Policy
	providers []policy.HintProvider
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

func (adm *Admitter) alignment() *alignment {
	adm.mu.Lock()
	defer adm.mu.Unlock()
	return adm.align
}

func (a *alignment) admit(pod *v1.Pod, c *v1.Container) error {
	if a == nil {
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
