package devicemanager

import (
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
