package leakwait

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is the test's own testing.TB, but keeps what is reported to
// Errorf instead of failing the test.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// blocked starts a goroutine that runs until release is called; release
// returns once it has ended.
func blocked() (release func()) {
	ch, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		<-ch
	}()
	return func() {
		close(ch)
		<-done
	}
}

// A goroutine that ends after goleak's own retries are over is waited for.
func TestWaitsForAGoroutineThatEndsLate(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	time.AfterFunc(time.Second, blocked())

	rec := &recorder{TB: t}
	VerifyNone(rec, 20*time.Second, ignore)
	assert.Empty(t, rec.errors)
}

// A goroutine still running when the limit passes is reported, with where
// it waits.
func TestReportsAGoroutineThatStays(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	defer blocked()()

	rec := &recorder{TB: t}
	VerifyNone(rec, 100*time.Millisecond, ignore)
	require.Len(t, rec.errors, 1)
	assert.Contains(t, rec.errors[0], "goroutines leaked")
	assert.Contains(t, rec.errors[0], "leakwait.blocked")
}
