package devicemanager

import "github.com/openkubelet/devmgr/internal/queue"

// updatesBuffer is the capacity of the Updates channel, as in the kubelet.
const updatesBuffer = 100

// newUpdateQueue returns the queue of the Updates channel: pod UIDs pushed
// while an update waits join it, each UID once, so that no UID is dropped
// however slow the reader.
func newUpdateQueue() *queue.Queue[ResourceUpdate] {
	return queue.New(updatesBuffer, mergeUpdates)
}

// mergeUpdates folds the pushed updates into one waiting update, each pod
// UID once, in the order first pushed.
func mergeUpdates(waiting, pushed []ResourceUpdate) []ResourceUpdate {
	var merged ResourceUpdate
	seen := map[string]bool{}
	for _, u := range append(waiting, pushed...) {
		for _, uid := range u.PodUIDs {
			if !seen[uid] {
				seen[uid] = true
				merged.PodUIDs = append(merged.PodUIDs, uid)
			}
		}
	}
	if len(merged.PodUIDs) == 0 {
		return nil
	}
	return []ResourceUpdate{merged}
}
