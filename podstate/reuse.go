package podstate

import "k8s.io/apimachinery/pkg/util/sets"

// The reuse pool is resource -> device IDs that later containers of the pod
// being admitted may take again: devices of its regular init containers, which
// have finished by the time the next container starts. The caller
// keeps one pool, for the pod it is admitting.

// AddContainerDevices adds to pool every device recorded for the container,
// per resource (set union). pool must not be nil.
func (l *Ledger) AddContainerDevices(podUID, containerName string, pool map[string]sets.Set[string]) {
	for res, rec := range l.pods[podUID][containerName] {
		if pool[res] == nil {
			pool[res] = sets.New[string]()
		}
		pool[res].Insert(rec.ids...)
	}
}

// RemoveContainerDevices removes from pool every device recorded for the
// container, per resource; like upstream it leaves an empty set for a
// resource the pool did not have. pool must not be nil.
func (l *Ledger) RemoveContainerDevices(podUID, containerName string, pool map[string]sets.Set[string]) {
	for res, rec := range l.pods[podUID][containerName] {
		if pool[res] == nil {
			pool[res] = sets.New[string]()
		}
		pool[res].Delete(rec.ids...)
	}
}
