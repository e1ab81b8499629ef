package node

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

// SetTopology makes every admission go through the policy p first, with the
// hints of providers (the device manager, typically), recording the chosen
// affinity in store. A policy that refuses a container fails its admission
// with a *policy.AffinityError.
func (n *Node) SetTopology(store *policy.Store, p policy.Policy, providers ...policy.HintProvider) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.align = &alignment{store: store, policy: p, providers: providers}
}

func (n *Node) alignment() *alignment {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.align
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
