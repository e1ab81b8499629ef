package podstate

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
)

// Upstream TestCheckpoint, in our words, for the ledger's half: records of
// several pods, containers and resources survive ToCheckpoint and
// FromCheckpoint into a fresh ledger with the same devices, responses and run
// options.
func TestCheckpointRoundTrip(t *testing.T) {
	const res3 = "domain3.com/resource3"
	l := NewLedger()
	l.Insert("pod1", "con1", res1, checkpoint.DevicesPerNUMA{0: {"dev1", "dev2"}},
		newResp(withCDI("vendor.com/gpu=dev1", "vendor.com/gpu=dev2"), withDevices("/dev/r1dev1", "/dev/r1dev1")))
	l.Insert("pod1", "con1", res2, checkpoint.DevicesPerNUMA{0: {"dev1", "dev2"}},
		newResp(withEnvs("key2", "val2"), withMounts("/home/r2lib1", "/usr/r2lib1")))
	l.Insert("pod1", "con2", res1, checkpoint.DevicesPerNUMA{0: {"dev3"}}, newResp())
	l.Insert("pod2", "con1", res1, checkpoint.DevicesPerNUMA{0: {"dev4"}}, newResp())
	l.Insert("pod3", "con3", res3, checkpoint.DevicesPerNUMA{NoTopology: {"dev5"}},
		newResp(withAnnotations("a", "b")))

	entries, err := l.ToCheckpoint()
	require.NoError(t, err)
	require.Len(t, entries, 5)

	restored := NewLedger()
	require.NoError(t, restored.FromCheckpoint(entries))
	assert.Equal(t, l.Len(), restored.Len())
	assert.Equal(t, l.devices(), restored.devices())
	for _, res := range []string{res1, res2, res3} {
		assert.Equal(t, l.Allocated(res), restored.Allocated(res))
	}
	for _, ref := range []ContainerRef{{"pod1", "con1"}, {"pod1", "con2"}, {"pod2", "con1"}, {"pod3", "con3"}} {
		for _, res := range []string{res1, res2, res3} {
			assert.Equal(t, l.ContainerDevices(ref.PodUID, ref.ContainerName, res),
				restored.ContainerDevices(ref.PodUID, ref.ContainerName, res))
			want, got := l.pods[ref.PodUID][ref.ContainerName][res], restored.pods[ref.PodUID][ref.ContainerName][res]
			if want != nil {
				assert.True(t, proto.Equal(want.resp, got.resp), "%v %s", ref, res)
			}
		}
		wantOpts, _ := l.RunOptions(ref.PodUID, ref.ContainerName)
		gotOpts, _ := restored.RunOptions(ref.PodUID, ref.ContainerName)
		assert.Equal(t, wantOpts, gotOpts)
	}
	again, err := restored.ToCheckpoint()
	require.NoError(t, err)
	assert.Equal(t, entries, again, "a restored ledger writes the same entries")
}

// Entries come in admission order: a new record is appended, a replaced one
// keeps its place, a removed one that comes back goes last; IDs are sorted
// and responses encoded deterministically, so the same history always
// writes the same entries.
func TestToCheckpointAdmissionOrder(t *testing.T) {
	manyEnvs := func() *pluginapi.ContainerAllocateResponse {
		r := newResp(withAnnotations("z", "1", "a", "2", "m", "3"))
		for i := range 50 {
			withEnvs(fmt.Sprintf("K%02d", i), fmt.Sprint(i))(r)
		}
		return r
	}
	numa := checkpoint.DevicesPerNUMA{1: {"d9", "d1", "d5"}, 0: {"c", "a"}}
	build := func() *Ledger {
		l := NewLedger()
		l.Insert("b", "x", res2, numa, manyEnvs())
		l.Insert("a", "y", res1, numa, manyEnvs())
		l.Insert("b", "x", res1, numa, manyEnvs())
		l.Insert("a", "x", res2, numa, manyEnvs())
		l.Insert("c", "a", res1, numa, manyEnvs())
		l.Insert("a", "y", res1, numa, newResp())  // replaced: keeps its place
		l.DeleteContainerResources("b", "x", res2) // removed ...
		l.Insert("b", "x", res2, numa, manyEnvs()) // ... and back: last
		l.Insert("d", "a", res1, checkpoint.DevicesPerNUMA{}, manyEnvs())
		l.DeletePods("d")
		return l
	}
	first, err := build().ToCheckpoint()
	require.NoError(t, err)
	var keys []string
	for _, e := range first {
		keys = append(keys, e.PodUID+"/"+e.ContainerName+"/"+e.ResourceName)
		assert.Equal(t, checkpoint.DevicesPerNUMA{0: {"a", "c"}, 1: {"d1", "d5", "d9"}}, e.DeviceIDs)
	}
	assert.Equal(t, []string{
		"a/y/" + res1, "b/x/" + res1, "a/x/" + res2, "c/a/" + res1, "b/x/" + res2,
	}, keys)

	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(manyEnvs())
	require.NoError(t, err)
	for range 20 {
		again, err := build().ToCheckpoint()
		require.NoError(t, err)
		assert.Equal(t, first, again)
		assert.Equal(t, want, again[1].AllocResp)
	}
}

// The response {Envs: {"A": "1"}} encodes to 0a 06 0a 01 41 12 01 31.
func TestToCheckpointWorkedExample(t *testing.T) {
	l := NewLedger()
	l.Insert("pod-uid-1", "ctr", "example.com/dev", checkpoint.DevicesPerNUMA{0: {"dev-1", "dev-0"}},
		newResp(withEnvs("A", "1")))
	entries, err := l.ToCheckpoint()
	require.NoError(t, err)
	assert.Equal(t, []checkpoint.PodDevicesEntry{{
		PodUID:        "pod-uid-1",
		ContainerName: "ctr",
		ResourceName:  "example.com/dev",
		DeviceIDs:     checkpoint.DevicesPerNUMA{0: {"dev-0", "dev-1"}},
		AllocResp:     []byte{0x0a, 0x06, 0x0a, 0x01, 0x41, 0x12, 0x01, 0x31},
	}}, entries)
}

func TestToCheckpointSkipsUnwritableRecords(t *testing.T) {
	cases := []struct {
		name     string
		resp     *pluginapi.ContainerAllocateResponse
		sentinel error
	}{
		{"no response", nil, ErrNoResponse},
		{"response with invalid UTF-8", newResp(withEnvs("K", "\xff")), ErrUnencodableResponse},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger()
			l.Insert("good", "ctr", res1, checkpoint.DevicesPerNUMA{0: {"a"}}, newResp())
			l.Insert("bad", "ctr", res1, checkpoint.DevicesPerNUMA{0: {"b"}}, tc.resp)
			entries, err := l.ToCheckpoint()
			require.ErrorIs(t, err, tc.sentinel)
			assert.Contains(t, err.Error(), `pod "bad" container "ctr" resource "domain1.com/resource1"`)
			require.Len(t, entries, 1)
			assert.Equal(t, "good", entries[0].PodUID)
			assert.True(t, l.IsAllocated(res1, "b"), "the record still holds its device")
		})
	}

	l := NewLedger()
	l.Insert("b", "ctr", res1, nil, nil)
	l.Insert("a", "ctr", res1, nil, nil)
	_, err1 := l.ToCheckpoint()
	_, err2 := l.ToCheckpoint()
	require.Error(t, err1)
	assert.Equal(t, err1.Error(), err2.Error(), "errors listed in a stable order")
	assert.Less(t, strings.Index(err1.Error(), `pod "b"`), strings.Index(err1.Error(), `pod "a"`), "in admission order")
}

func TestFromCheckpoint(t *testing.T) {
	good, err := proto.Marshal(newResp(withEnvs("K", "V")))
	require.NoError(t, err)
	entries := []checkpoint.PodDevicesEntry{
		{PodUID: "p1", ContainerName: "c", ResourceName: res1, DeviceIDs: checkpoint.DevicesPerNUMA{0: {"a"}}, AllocResp: good},
		{PodUID: "p2", ContainerName: "c", ResourceName: res1, DeviceIDs: checkpoint.DevicesPerNUMA{0: {"b"}}, AllocResp: []byte{0xff, 0xff}},
		{PodUID: "p3", ContainerName: "c", ResourceName: res1, DeviceIDs: checkpoint.DevicesPerNUMA{0: {"c"}}, AllocResp: nil},
		{PodUID: "p4", ContainerName: "c", ResourceName: res1, DeviceIDs: nil, AllocResp: []byte{}},
		{PodUID: "p1", ContainerName: "c", ResourceName: res1, DeviceIDs: checkpoint.DevicesPerNUMA{0: {"z"}}, AllocResp: good},
	}
	l := NewLedger()
	err = l.FromCheckpoint(entries)
	require.ErrorIs(t, err, ErrUndecodableResponse)
	assert.Contains(t, err.Error(), `checkpoint entry 1 (pod "p2" container "c" resource "domain1.com/resource1")`)

	assert.False(t, l.HasPod("p2"), "undecodable entry skipped")
	assert.Equal(t, sets.New("z"), l.ContainerDevices("p1", "c", res1), "later entry for the same record wins")
	assert.Equal(t, sets.New("c", "z"), l.Allocated(res1))
	assert.True(t, proto.Equal(newResp(), l.pods["p3"]["c"][res1].resp), "nil AllocResp restores an empty response")

	out, err := l.ToCheckpoint()
	require.NoError(t, err)
	require.Len(t, out, 3)
	assert.NotNil(t, out[1].AllocResp, "an empty response is written as empty bytes, not null")
	assert.Empty(t, out[1].AllocResp)
	assert.Equal(t, checkpoint.DevicesPerNUMA{}, out[2].DeviceIDs, "nil device map restored as empty")

	require.NoError(t, NewLedger().FromCheckpoint(nil))
	var joined interface{ Unwrap() []error }
	require.ErrorAs(t, l.FromCheckpoint(entries[:2]), &joined)
	assert.Len(t, joined.Unwrap(), 1)
	assert.NotErrorIs(t, l.FromCheckpoint(entries[2:]), ErrUndecodableResponse)
}
