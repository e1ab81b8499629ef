package devicemanager

import (
	"context"
	"sync"
)

// updatesBuffer is the capacity of the Updates channel, as in the kubelet.
const updatesBuffer = 100

// updateQueue delivers pod UIDs on a channel without ever dropping one: UIDs
// pushed while the channel is full wait in pending, merged and de-duplicated,
// and go out together in the next update.
type updateQueue struct {
	out    chan ResourceUpdate
	signal chan struct{} // capacity 1: "pending is not empty"
	once   sync.Once

	// mu guards pending and queued.
	mu      sync.Mutex
	pending []string
	queued  map[string]struct{}
}

func newUpdateQueue() *updateQueue {
	return &updateQueue{
		out:    make(chan ResourceUpdate, updatesBuffer),
		signal: make(chan struct{}, 1),
		queued: map[string]struct{}{},
	}
}

// push adds UIDs to the next update; it never blocks.
func (q *updateQueue) push(uids []string) {
	q.mu.Lock()
	for _, uid := range uids {
		if _, ok := q.queued[uid]; !ok {
			q.queued[uid] = struct{}{}
			q.pending = append(q.pending, uid)
		}
	}
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// take returns and clears the pending UIDs.
func (q *updateQueue) take() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	uids := q.pending
	q.pending = nil
	clear(q.queued)
	return uids
}

// run sends pending UIDs until ctx ends. It is the channel's only sender.
func (q *updateQueue) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.signal:
		}
		uids := q.take()
		if len(uids) == 0 {
			continue
		}
		select {
		case q.out <- ResourceUpdate{PodUIDs: uids}:
		case <-ctx.Done():
			return
		}
	}
}

// close closes the channel once its sender has ended.
func (q *updateQueue) close() { q.once.Do(func() { close(q.out) }) }
