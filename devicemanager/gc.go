package devicemanager

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

// Garbage collection: the allocations of pods that are no longer active go.

// UpdateAllocatedDevices garbage-collects: allocations of pods that are no
// longer active are dropped (pending reservations and pods being admitted
// are kept). It does nothing until the pod sources are ready, and it does not
// write the checkpoint. An embedder whose pod sources become ready after
// Start calls it then, so that what the checkpoint holds for pods that are
// gone is released before anything reads the allocations.
func (m *ManagerImpl) UpdateAllocatedDevices() { m.collectInactivePods(ReleasePodInactive) }

// collectInactivePods is UpdateAllocatedDevices; reason goes with the
// events of what it releases.
func (m *ManagerImpl) collectInactivePods(reason ReleaseReason) {
	m.mu.Lock()
	src := m.podSource
	// A pod admitted after the list is read is not in it, yet is active:
	// only pods whose last commit is older than the list are collected.
	seen := m.core.commits
	m.mu.Unlock()
	pods := src.activePods()
	if !src.sourcesReady.AllReady() {
		return
	}
	m.mu.Lock()
	gone, eff := m.core.collectPods(pods, seen, reason)
	m.signal(eff)
	m.mu.Unlock()
	if len(gone) > 0 {
		m.log.V(3).Info("Removed allocations of inactive pods", "podUIDs", gone)
	}
}

// collectPods drops the records of pods not in active, except pods being
// admitted and pods that recorded an allocation after commit seen (the
// active list may predate them), and reports them released for reason. It
// and UnprepareClaim are the only places records leave the ledger once
// admitted; claims are never collected. The admission
// records of pods that are not active and hold nothing go too.
func (c *core) collectPods(active []*v1.Pod, seen uint64, reason ReleaseReason) (gone []string, eff effects) {
	isActive := make(sets.Set[string], len(active))
	for _, p := range active {
		isActive.Insert(string(p.UID))
	}
	for uid := range c.ledger.Pods() {
		a := c.pods[uid]
		if !isActive.Has(uid) && !isClaim(uid) && (a == nil || a.calls == 0 && a.lastCommit <= seen) {
			gone = append(gone, uid)
		}
	}
	slices.Sort(gone)
	if len(gone) > 0 {
		eff.events = c.releasedEvents(gone, reason)
		c.ledger.DeletePods(gone...)
	}
	for uid, a := range c.pods {
		if a.calls == 0 && !isActive.Has(uid) && !c.ledger.HasPod(uid) {
			delete(c.pods, uid)
		}
	}
	return gone, eff
}
