package policy

import (
	"errors"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/openkubelet/devmgr/topology"
)

// HintProvider gives the topology hints of a container's resources, as
// devicemanager.ManagerImpl does (the kubelet's topologymanager.HintProvider,
// container scope).
type HintProvider interface {
	GetTopologyHints(pod *v1.Pod, container *v1.Container) map[string][]topology.Hint
}

// PodHintProvider gives the topology hints of a whole pod's resources, as
// devicemanager.ManagerImpl does (the kubelet's topologymanager.HintProvider,
// pod scope).
type PodHintProvider interface {
	GetPodTopologyHints(pod *v1.Pod) map[string][]topology.Hint
}

// ErrNilContainer is returned by Store.Admit for a nil pod or container, and
// by Store.AdmitPod for a nil pod.
var ErrNilContainer = errors.New("admission needs a pod and a container")

// AffinityError is returned by Store.Admit when the policy refuses a
// container, and by Store.AdmitPod when it refuses a pod (ContainerName is
// then empty). Its message is the kubelet's; Reason is the kubelet's admission
// reason. Its Is method matches any AffinityError, so
// errors.Is(err, &AffinityError{}) reports a refusal; use errors.As to read
// the fields.
type AffinityError struct {
	Policy        string
	PodUID        string
	ContainerName string
	// Hint is the best hint the merge found, which the policy refused.
	Hint topology.Hint
}

// Error returns the kubelet's message for a refused admission.
func (e *AffinityError) Error() string {
	return "Resources cannot be allocated with Topology locality"
}

// Reason returns the kubelet's pod admission reason, "TopologyAffinityError".
func (e *AffinityError) Reason() string { return "TopologyAffinityError" }

// Is reports whether target is an AffinityError, whatever its fields.
func (e *AffinityError) Is(target error) bool {
	_, ok := target.(*AffinityError)
	return ok
}

// Store records the affinity chosen for each container, by pod UID and
// container name, and gives it to the device manager (it is a
// topology.AffinityStore, for devicemanager.Options.AffinityStore).
//
// Store is the one stateful type of this package: every method is safe for
// concurrent use. Hints go in and out as copies, so neither side can change
// the other's mask. The zero value is not usable; call NewStore.
type Store struct {
	// mu guards pods.
	mu   sync.RWMutex
	pods map[string]map[string]storedHint // pod UID -> container name -> hint
}

// storedHint is a Hint without its pointer.
type storedHint struct {
	affinity    topology.BitMask
	hasAffinity bool
	preferred   bool
}

var _ topology.AffinityStore = (*Store)(nil)

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{pods: make(map[string]map[string]storedHint)}
}

// SetAffinity records h for the container, replacing what was there.
func (s *Store) SetAffinity(podUID, containerName string, h topology.Hint) {
	stored := storedHint{preferred: h.Preferred}
	if h.NUMANodeAffinity != nil {
		stored.affinity, stored.hasAffinity = *h.NUMANodeAffinity, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	byContainer := s.pods[podUID]
	if byContainer == nil {
		byContainer = make(map[string]storedHint)
		s.pods[podUID] = byContainer
	}
	byContainer[containerName] = stored
}

// GetAffinity returns the hint recorded for the container, or Hint{} (no
// affinity) for a container it does not know.
func (s *Store) GetAffinity(podUID, containerName string) topology.Hint {
	s.mu.RLock()
	stored := s.pods[podUID][containerName]
	s.mu.RUnlock()
	h := topology.Hint{Preferred: stored.preferred}
	if stored.hasAffinity {
		h.NUMANodeAffinity = &stored.affinity
	}
	return h
}

// RemovePod forgets every container of the pod.
func (s *Store) RemovePod(podUID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pods, podUID)
}

// Admit runs one container admission, as the kubelet's container scope
// does: it asks every provider for the container's hints, merges them with
// p and, if p admits the result, records it and returns it. If p refuses,
// it records nothing and returns an *AffinityError. Under None it asks
// no provider and records nothing (the container has no affinity), as the
// kubelet's none policy. Nil providers are skipped. The store's lock is not
// held while providers are asked: callers admit one container at a time, as
// the kubelet does.
func (s *Store) Admit(p Policy, pod *v1.Pod, container *v1.Container, providers ...HintProvider) (topology.Hint, error) {
	if pod == nil || container == nil {
		return topology.Hint{}, ErrNilContainer
	}
	if p.Name() == None {
		return topology.Hint{}, nil
	}
	best, admit := merge(p, providers, func(hp HintProvider) map[string][]topology.Hint {
		return hp.GetTopologyHints(pod, container)
	})
	if !admit {
		return topology.Hint{}, &AffinityError{Policy: p.Name(), PodUID: string(pod.UID), ContainerName: container.Name, Hint: best}
	}
	s.SetAffinity(string(pod.UID), container.Name, best)
	return best, nil
}

// AdmitPod runs one pod admission, as the kubelet's pod scope does: it asks
// every provider for the pod's hints, merges them with p and, if p admits the
// result, records it for every init and app container of the pod and returns
// it. If p refuses, it records nothing and returns an *AffinityError. Under
// None it asks no provider and records nothing. Nil providers are skipped.
func (s *Store) AdmitPod(p Policy, pod *v1.Pod, providers ...PodHintProvider) (topology.Hint, error) {
	if pod == nil {
		return topology.Hint{}, ErrNilContainer
	}
	if p.Name() == None {
		return topology.Hint{}, nil
	}
	best, admit := merge(p, providers, func(hp PodHintProvider) map[string][]topology.Hint {
		return hp.GetPodTopologyHints(pod)
	})
	if !admit {
		return topology.Hint{}, &AffinityError{Policy: p.Name(), PodUID: string(pod.UID), Hint: best}
	}
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			s.SetAffinity(string(pod.UID), cs[i].Name, best)
		}
	}
	return best, nil
}

// merge asks each provider that is not nil for its hints and merges them
// with p.
func merge[P comparable](p Policy, providers []P, hintsOf func(P) map[string][]topology.Hint) (topology.Hint, bool) {
	var none P
	hints := make([]map[string][]topology.Hint, 0, len(providers))
	for _, hp := range providers {
		if hp != none {
			hints = append(hints, hintsOf(hp))
		}
	}
	return p.Merge(hints)
}
