// Package leakwait checks that the goroutines a test started have ended,
// waiting for them as long as the caller allows: goleak's own checks give
// up after about 0.4 s of retries, less than a goroutine that is still
// unwinding from a cancelled call may need on a busy machine.
package leakwait

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// VerifyNone fails t unless, within limit, goleak finds no goroutine other
// than those opts ignore (goleak.IgnoreCurrent, taken when the test began,
// for one). It reports goleak's last finding.
func VerifyNone(t testing.TB, limit time.Duration, opts ...goleak.Option) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := goleak.Find(opts...) // retries for a while by itself
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("goroutines leaked: %v", err)
			return
		}
	}
}
