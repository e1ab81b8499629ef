package devicemanager

import (
	"slices"
	"sync"
)

// queue hands values to a channel, in order, without ever blocking the
// producer or dropping a value: pushed values wait in a slice without
// bound, and a goroutine, running only while some wait, feeds the channel.
// With merge set, values pushed while others still wait are folded into
// them (merge gets the waiting values and the pushed ones and returns what
// waits now). close ends the goroutine, keeps what it had not handed over
// (undelivered) and closes the channel.
type queue[T any] struct {
	out   chan T
	merge func(waiting, pushed []T) []T
	stop  chan struct{} // closed by close
	wg    sync.WaitGroup

	// mu guards everything below.
	mu      sync.Mutex
	pending []T
	// sending is set while a goroutine feeds out.
	sending bool
	closed  bool
	// drained is set once close has ended the goroutine: pending then
	// holds the values out never delivered.
	drained bool
}

// newQueue returns a queue whose channel has the given buffer.
func newQueue[T any](buffer int, merge func(waiting, pushed []T) []T) *queue[T] {
	return &queue[T]{out: make(chan T, buffer), merge: merge, stop: make(chan struct{})}
}

// push queues vs; it never blocks on the reader. After close it does
// nothing.
func (q *queue[T]) push(vs ...T) {
	if len(vs) == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	if q.merge != nil {
		q.pending = q.merge(q.pending, vs)
	} else {
		q.pending = append(q.pending, vs...)
	}
	if !q.sending {
		q.sending = true
		q.wg.Add(1)
		go q.send()
	}
}

// send hands the waiting values to out, oldest first, until none is left or
// the queue is closed; then it puts back what it took and did not hand over.
func (q *queue[T]) send() {
	defer q.wg.Done()
	for {
		q.mu.Lock()
		if len(q.pending) == 0 || q.closed {
			q.sending = false
			q.mu.Unlock()
			return
		}
		batch := q.pending
		q.pending = nil
		q.mu.Unlock()
		for i, v := range batch {
			select {
			case q.out <- v:
			case <-q.stop:
				q.mu.Lock()
				q.pending = slices.Concat(batch[i:], q.pending)
				q.mu.Unlock()
				return
			}
		}
	}
}

// close refuses further values, ends the goroutine that feeds out (values
// not yet received stay waiting) and closes out. Idempotent.
func (q *queue[T]) close() {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.closed = true
	close(q.stop)
	q.mu.Unlock()
	q.wg.Wait()
	close(q.out)
	q.mu.Lock()
	q.drained = true
	q.mu.Unlock()
}

// undelivered returns a copy of the values out never delivered once close
// has ended the goroutine, else nil.
func (q *queue[T]) undelivered() []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.drained {
		return nil
	}
	return slices.Clone(q.pending)
}
