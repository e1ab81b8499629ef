package devicemanager

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A resource removed after its grace period is reported once in removed.
func TestCollectedResourceReportedOnce(t *testing.T) {
	h := newHarness(t).start()
	p1 := h.registered(res1, devices("a", 1))
	p2 := h.registered(res2, devices("b", 1))
	p1.CloseStreams()
	require.Equal(t, []string{res1}, h.stepUntilRemoved(res1))
	p2.CloseStreams()
	h.waitCapacity(res2, 1, 0)
	_, _, removed := h.m.GetCapacity()
	assert.Empty(t, removed)
}

// GetAllocatableDevices leaves out a resource restored from the checkpoint
// whose plugin has not reported yet.
func TestAllocatableDevicesOmitsRestoredResource(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 1))
	h.restart(nil, nil)
	assert.NotContains(t, h.m.GetAllocatableDevices(), res1)
}

// ShouldResetExtendedResourceCapacity is false when the checkpoint directory
// cannot be listed.
func TestShouldResetFalseOnListError(t *testing.T) {
	h := newHarness(t)
	h.faultyStore().listErr = errors.New("boom")
	assert.False(t, h.m.ShouldResetExtendedResourceCapacity())
}
