package podstate

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/openkubelet/devmgr/checkpoint"
)

func TestReserveCommit(t *testing.T) {
	l := NewLedger()
	rid, err := l.Reserve("pod", "ctr", res1, []string{"b", "a", "b"})
	require.NoError(t, err)
	assert.NotZero(t, rid)
	assert.Equal(t, 1, l.Pending())
	assert.Equal(t, sets.New("a", "b"), l.Allocated(res1), "pending devices are in use")
	assert.Nil(t, l.Owners(res1, "a"), "a reservation is not an owner")
	assert.Nil(t, l.ContainerDevices("pod", "ctr", res1), "no record yet")

	resp := newResp(withEnvs("K", "V"))
	devs := DeviceInstances{"a": numaDev("a", 1), "b": numaDev("b", 0, 1)}
	require.NoError(t, l.Commit(rid, devs, resp))
	assert.Equal(t, 0, l.Pending())
	assert.Equal(t, sets.New("a", "b"), l.Allocated(res1))
	assert.Equal(t, []ContainerRef{{"pod", "ctr"}}, l.Owners(res1, "b"))
	entries, err := l.ToCheckpoint()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, checkpoint.DevicesPerNUMA{0: {"b"}, 1: {"a", "b"}}, entries[0].DeviceIDs)
	opts, _ := l.RunOptions("pod", "ctr")
	assert.Equal(t, []EnvVar{{"K", "V"}}, opts.Envs)

	err = l.Commit(rid, devs, resp)
	require.ErrorIs(t, err, ErrUnknownReservation, "a reservation commits once")
	assert.False(t, l.Rollback(rid), "a committed reservation cannot be rolled back")
	assert.Equal(t, sets.New("a", "b"), l.Allocated(res1))
}

func TestReserveRollback(t *testing.T) {
	l := NewLedger()
	l.Insert("pod", "init", res1, checkpoint.DevicesPerNUMA{0: {"shared"}}, newResp())
	rid, err := l.Reserve("pod", "app", res1, []string{"shared", "fresh"})
	require.NoError(t, err, "the same pod may reserve its init container's device again")

	assert.True(t, l.Rollback(rid))
	assert.False(t, l.Rollback(rid), "second rollback is a no-op")
	assert.Equal(t, sets.New("shared"), l.Allocated(res1), "the record keeps its device, the fresh one is free")
	assert.Equal(t, 0, l.Pending())
}

// A pending reservation survives garbage collection of
// its pod (upstream PR #137534: the same device handed to two pods).
func TestDeletePodsKeepsReservations(t *testing.T) {
	l := NewLedger()
	l.Insert("gone", "ctr", res1, checkpoint.DevicesPerNUMA{0: {"old"}}, newResp())
	rid, err := l.Reserve("gone", "ctr2", res1, []string{"new"})
	require.NoError(t, err)

	l.DeletePods("gone")
	assert.Equal(t, sets.New("new"), l.Allocated(res1), "record freed, reservation kept")
	_, err = l.Reserve("other", "ctr", res1, []string{"new"})
	require.ErrorIs(t, err, ErrDeviceInUse, "another pod cannot take the reserved device")

	require.NoError(t, l.Commit(rid, nil, newResp()))
	assert.True(t, l.HasPod("gone"), "the commit records the allocation; a later collection drops it")
	assert.Equal(t, checkpoint.DevicesPerNUMA{NoTopology: {"new"}}, l.pods["gone"]["ctr2"][res1].numa,
		"a device unknown to devs has no topology")
}

func TestReserveRefusesOtherPodsDevices(t *testing.T) {
	cases := []struct {
		name string
		res  string
		ids  []string
		pod  string
		ok   bool
	}{
		{"device recorded for another pod", res1, []string{"free", "recorded"}, "pod2", false},
		{"device reserved by another pod", res1, []string{"reserved"}, "pod2", false},
		{"same pod, recorded", res1, []string{"recorded"}, "pod1", true},
		{"same pod, reserved", res1, []string{"reserved"}, "pod1", true},
		{"same ID under another resource", res2, []string{"recorded", "reserved"}, "pod2", true},
		{"free devices", res1, []string{"free"}, "pod2", true},
		{"no devices", res1, nil, "pod2", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger()
			l.Insert("pod1", "a", res1, checkpoint.DevicesPerNUMA{0: {"recorded"}}, newResp())
			_, err := l.Reserve("pod1", "b", res1, []string{"reserved"})
			require.NoError(t, err)
			before := l.Allocated(res1)

			rid, err := l.Reserve(tc.pod, "c", tc.res, tc.ids)
			if !tc.ok {
				require.ErrorIs(t, err, ErrDeviceInUse)
				assert.Zero(t, rid)
				assert.Equal(t, before, l.Allocated(res1), "nothing reserved on refusal")
				assert.Equal(t, 1, l.Pending())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, 2, l.Pending())
			assert.True(t, l.Allocated(tc.res).HasAll(tc.ids...))
			assert.True(t, l.Rollback(rid))
			assert.Equal(t, before, l.Allocated(res1))
		})
	}
}

func TestCommitReplacesEarlierRecord(t *testing.T) {
	l := NewLedger()
	l.Insert("pod", "ctr", res1, checkpoint.DevicesPerNUMA{0: {"a"}}, newResp(withEnvs("OLD", "1")))
	rid, err := l.Reserve("pod", "ctr", res1, []string{"b"})
	require.NoError(t, err)
	resp := newResp(withEnvs("NEW", "1"))
	require.NoError(t, l.Commit(rid, DeviceInstances{"b": numaDev("b", 0)}, resp))
	assert.Equal(t, sets.New("b"), l.Allocated(res1))
	assert.True(t, proto.Equal(resp, l.pods["pod"]["ctr"][res1].resp))
}
