package queue_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/openkubelet/devmgr/internal/queue"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Values come out in the order pushed, however many wait, and Push never
// waits for the reader.
func TestValuesComeOutInOrderWithoutBlockingThePusher(t *testing.T) {
	q := queue.New[int](0, nil)
	for i := range 1000 {
		q.Push(i) // nobody reads yet: an unbuffered channel would block here
	}
	for i := range 1000 {
		assert.Equal(t, i, <-q.Out())
	}
	q.Close()
	_, open := <-q.Out()
	assert.False(t, open, "Close closes the channel")
	assert.Empty(t, q.Undelivered())
}

// With a merge function, values pushed while others wait are folded into
// them.
func TestMergeFoldsWaitingValues(t *testing.T) {
	sum := func(waiting, pushed []int) []int {
		total := 0
		for _, v := range append(waiting, pushed...) {
			total += v
		}
		return []int{total}
	}
	q := queue.New(0, sum)
	q.Push(1)
	q.Push(2, 3)
	q.Push(4)
	// The sender took the first value (1) or the sum of some before it
	// blocked; whatever it holds and what waits add up to 10.
	total := 0
	for total < 10 {
		total += <-q.Out()
	}
	assert.Equal(t, 10, total)
	q.Close()
}

// Close keeps what the reader never took, in order, and drops later pushes.
func TestCloseKeepsTheUndelivered(t *testing.T) {
	q := queue.New[string](1, nil)
	assert.Nil(t, q.Undelivered(), "nothing before Close")
	q.Push("a", "b", "c")
	assert.Equal(t, "a", <-q.Out())
	q.Close()
	q.Close() // idempotent
	q.Push("d")
	var got []string
	for v := range q.Out() {
		got = append(got, v) // what sat in the channel's buffer
	}
	assert.Equal(t, []string{"b", "c"}, append(got, q.Undelivered()...), "every value delivered or kept, once, in order")
}
