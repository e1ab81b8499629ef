// Package queue is an unbounded queue in front of a channel, for a producer
// that must never block on its reader (the device manager's Updates and
// Events).
package queue

import (
	"slices"
	"sync"
)

// Queue hands values to a channel, in order, without ever blocking the
// producer or dropping a value: pushed values wait in a slice without
// bound, and a goroutine, running only while some wait, feeds the channel.
// With merge set, values pushed while others still wait are folded into
// them (merge gets the waiting values and the pushed ones and returns what
// waits now). Close ends the goroutine, keeps what it had not handed over
// (Undelivered) and closes the channel. Its methods are safe for concurrent
// use.
type Queue[T any] struct {
	out   chan T
	merge func(waiting, pushed []T) []T
	stop  chan struct{} // closed by Close
	wg    sync.WaitGroup

	// mu guards everything below.
	mu      sync.Mutex
	pending []T
	// sending is set while a goroutine feeds out.
	sending bool
	closed  bool
	// drained is set once Close has ended the goroutine: pending then
	// holds the values out never delivered.
	drained bool
}

// New returns a queue whose channel has the given buffer; merge may be nil.
func New[T any](buffer int, merge func(waiting, pushed []T) []T) *Queue[T] {
	return &Queue[T]{out: make(chan T, buffer), merge: merge, stop: make(chan struct{})}
}

// Out is the channel the values come out of; Close closes it.
func (q *Queue[T]) Out() <-chan T { return q.out }

// Push queues vs; it never blocks on the reader. After Close it does
// nothing.
func (q *Queue[T]) Push(vs ...T) {
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
func (q *Queue[T]) send() {
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

// Close refuses further values, ends the goroutine that feeds out (values
// not yet received stay waiting) and closes out. Idempotent.
func (q *Queue[T]) Close() {
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

// Undelivered returns a copy of the values out never delivered once Close
// has ended the goroutine, else nil.
func (q *Queue[T]) Undelivered() []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.drained {
		return nil
	}
	return slices.Clone(q.pending)
}
