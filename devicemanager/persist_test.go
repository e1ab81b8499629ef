package devicemanager

import (
	"time"

	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/plugintest"
)

// encodedOf returns the checkpoint entry the ledger holds for the container's
// record of res.
func (h *harness) encodedOf(pod *v1.Pod, container, res string) *checkpoint.EncodedEntry {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	return h.m.ledger.Encoded(string(pod.UID), container, res)
}

// An admission that commits while another one's plugin call is in flight
// prepares its checkpoint entry before it queues for the write; one alone
// leaves that to the encoder, which builds transfers only for entries it
// hashes a second time. Either way the file is what the ledger says.
func TestOverlappingAdmissionPreparesItsEntry(t *testing.T) {
	h := newHarness(t).start()
	slow := h.registered(res1, devices("a", 1), func(o *plugintest.Options) { o.Endpoint = "slow.sock" })
	h.registered(res2, devices("b", 3), func(o *plugintest.Options) { o.Endpoint = "fast.sock" })
	// The write of res2's first list, which counts as a write under way,
	// must be over before the first admission.
	h.eventually(func() bool {
		if h.m.writers.Load() != 0 {
			return false
		}
		store, err := checkpoint.NewManager(h.dir)
		require.NoError(t, err)
		data := checkpoint.New(nil, nil)
		if store.GetCheckpoint(checkpoint.DeviceManagerKey, data) != nil {
			return false
		}
		_, registered := data.GetData()
		_, ok := registered[res2]
		return ok
	}, "the checkpoint names %s and no write is under way", res2)

	alone := newPod("alone", ctr("app", res2, 1))
	h.pods.add(alone)
	require.NoError(t, h.admit(alone))
	e := h.encodedOf(alone, "app", res2)
	require.NotNil(t, e)
	assert.False(t, e.Prepared(), "an admission with nothing else under way prepared its entry")

	release := slow.Block(plugintest.MethodAllocate)
	defer release()
	stuck := newPod("stuck", ctr("app", res1, 1))
	h.pods.add(stuck)
	admitted := h.admitHeld(slow, stuck)

	other := newPod("other", ctr("app", res2, 1))
	h.pods.add(other)
	require.NoError(t, h.admit(other))
	e = h.encodedOf(other, "app", res2)
	require.NotNil(t, e)
	assert.True(t, e.Prepared(), "an admission beside a plugin call in flight left its entry unprepared")

	release()
	admitted()
	// An admission sorted before "other" makes the encoder hash its
	// entry again, through the prepared transfer; reading the file back
	// verifies the checksum.
	first := newPod("first", ctr("app", res2, 1))
	h.pods.add(first)
	h.m.UpdateAllocatedDevices()
	require.NoError(t, h.admit(first))
	entries, _ := readCheckpointFile(t, h.dir)
	h.m.mu.Lock()
	want, err := h.m.ledger.ToCheckpoint()
	h.m.mu.Unlock()
	require.NoError(t, err)
	assert.Equal(t, want, entries)
	assert.Len(t, entries, 4)
}

// getCapacityWithin calls GetCapacity in a goroutine of its own and reports
// whether it returned within d; either way it returns once the call has.
func getCapacityWithin(m *ManagerImpl, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.GetCapacity()
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// fastCapacity reports whether GetCapacity answers from the published view.
func (h *harness) fastCapacity() bool {
	v := h.m.capView.Load()
	if v == nil {
		return false
	}
	_, _, ok := v.lists()
	return ok
}

// While every registered resource has a running plugin, GetCapacity
// answers without the manager's lock, so that it never waits behind a
// device update or an admission; while a plugin is gone (its resource may
// expire), it takes the lock; a new registration brings the view back.
// Every GetCapacity of the package's tests checks the view against the
// state (verifyCapacityView).
func TestGetCapacityWithoutTheLockWhilePluginsRun(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 2))
	h.waitCapacity(res1, 2, 2)
	require.True(t, h.fastCapacity())

	// The check of the view takes the lock; not for this call.
	verifyCapacityView = false
	h.m.mu.Lock()
	returned := getCapacityWithin(h.m, waitTimeout)
	h.m.mu.Unlock()
	verifyCapacityView = true
	assert.True(t, returned, "GetCapacity waited for the lock with its plugin running")

	p.Stop()
	h.waitCapacity(res1, 2, 0)
	assert.False(t, h.fastCapacity(), "the view is used with the plugin gone")

	h.registered(res1, devices("dev", 3), func(o *plugintest.Options) { o.Endpoint = "again.sock" })
	h.waitCapacity(res1, 3, 3)
	assert.True(t, h.fastCapacity(), "no view after the plugin registered again")
}
