package podstate

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/openkubelet/devmgr/checkpoint"
)

const (
	res1 = "domain1.com/resource1"
	res2 = "domain2.com/resource2"
)

func TestLedgerQueries(t *testing.T) {
	l := NewLedger()
	l.Insert("pod1", "ctr1", res1, checkpoint.DevicesPerNUMA{0: {"d2", "d1"}, 1: {"d1"}}, newResp())
	l.Insert("pod1", "ctr2", res1, checkpoint.DevicesPerNUMA{NoTopology: {"d3"}}, newResp())
	l.Insert("pod1", "ctr2", res2, checkpoint.DevicesPerNUMA{0: {"d1"}}, newResp())
	l.Insert("pod2", "ctr1", res1, checkpoint.DevicesPerNUMA{1: {"d4"}}, nil)

	assert.Equal(t, 2, l.Len())
	assert.Equal(t, sets.New("pod1", "pod2"), sets.New(slices.Collect(l.Pods())...))
	assert.True(t, l.HasPod("pod2"))
	assert.False(t, l.HasPod("pod3"))

	cases := []struct {
		name     string
		pod, ctr string
		res      string
		want     sets.Set[string]
	}{
		{"multi-node device counted once", "pod1", "ctr1", res1, sets.New("d1", "d2")},
		{"no-topology record", "pod1", "ctr2", res1, sets.New("d3")},
		{"same ID under another resource", "pod1", "ctr2", res2, sets.New("d1")},
		{"record without response still holds", "pod2", "ctr1", res1, sets.New("d4")},
		{"unknown pod", "pod3", "ctr1", res1, nil},
		{"unknown container", "pod1", "ctr3", res1, nil},
		{"unknown resource", "pod1", "ctr1", res2, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := l.ContainerDevices(tc.pod, tc.ctr, tc.res)
			if tc.want == nil {
				assert.Nil(t, got)
				return
			}
			assert.Equal(t, tc.want, got)
		})
	}

	assert.Equal(t, sets.New("d1", "d2", "d3"), l.PodDevices("pod1", res1))
	assert.Equal(t, sets.New[string](), l.PodDevices("pod3", res1), "never nil")
	assert.Equal(t, map[string]sets.Set[string]{
		res1: sets.New("d1", "d2", "d3", "d4"),
		res2: sets.New("d1"),
	}, l.devices())

	assert.Equal(t, sets.New("d1", "d2", "d3", "d4"), l.Allocated(res1))
	assert.Equal(t, 4, l.AllocatedCount(res1))
	assert.True(t, l.IsAllocated(res2, "d1"))
	assert.False(t, l.IsAllocated(res2, "d2"))
	assert.Equal(t, []string{res1, res2}, l.AllocatedResources())
	assert.Empty(t, l.Allocated("none"))
}

func TestInsertReplacesRecord(t *testing.T) {
	l := NewLedger()
	l.Insert("pod", "ctr", res1, checkpoint.DevicesPerNUMA{0: {"a", "b"}}, newResp())
	l.Insert("pod", "ctr", res1, checkpoint.DevicesPerNUMA{0: {"b", "c"}}, newResp(withEnvs("K", "V")))

	assert.Equal(t, sets.New("b", "c"), l.Allocated(res1), "a released, c held")
	assert.Nil(t, l.Owners(res1, "a"))
	entries, err := l.ToCheckpoint()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, checkpoint.DevicesPerNUMA{0: {"b", "c"}}, entries[0].DeviceIDs)
}

func TestInsertCopiesNUMAMap(t *testing.T) {
	l := NewLedger()
	numa := checkpoint.DevicesPerNUMA{0: {"b", "a"}}
	l.Insert("pod", "ctr", res1, numa, newResp())
	numa[0][0] = "zzz"
	numa[1] = []string{"x"}
	assert.Equal(t, sets.New("a", "b"), l.ContainerDevices("pod", "ctr", res1))
	assert.False(t, l.IsAllocated(res1, "x"))
}

func TestDeletePods(t *testing.T) {
	l := NewLedger()
	l.Insert("pod1", "init", res1, checkpoint.DevicesPerNUMA{0: {"shared"}}, newResp())
	l.Insert("pod1", "app", res1, checkpoint.DevicesPerNUMA{0: {"shared", "own"}}, newResp())
	l.Insert("pod2", "app", res1, checkpoint.DevicesPerNUMA{0: {"other"}}, newResp())

	l.DeletePods("pod1", "unknown")
	assert.Equal(t, 1, l.Len())
	assert.Equal(t, sets.New("other"), l.Allocated(res1))
	assert.Nil(t, l.Owners(res1, "shared"))

	l.DeletePods("pod2")
	assert.Equal(t, 0, l.Len())
	assert.Empty(t, l.AllocatedResources())
	assert.Empty(t, l.index, "no empty index entries left")
	entries, err := l.ToCheckpoint()
	require.NoError(t, err)
	assert.Nil(t, entries)
}

func TestDeleteContainerResources(t *testing.T) {
	cases := []struct {
		name      string
		pod, ctr  string
		resources []string
		wantPods  int
		wantRes1  sets.Set[string]
		wantRes2  sets.Set[string]
	}{
		{"one resource of two", "pod", "ctr", []string{res2}, 1, sets.New("a"), sets.New[string]()},
		{"all resources drops container and pod", "pod", "ctr", []string{res1, res2}, 0,
			sets.New[string](), sets.New[string]()},
		{"resource without record ignored", "pod", "ctr", []string{"other"}, 1, sets.New("a"), sets.New("b")},
		{"unknown container", "pod", "nope", []string{res1}, 1, sets.New("a"), sets.New("b")},
		{"unknown pod", "nope", "ctr", []string{res1}, 1, sets.New("a"), sets.New("b")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger()
			l.Insert("pod", "ctr", res1, checkpoint.DevicesPerNUMA{0: {"a"}}, newResp())
			l.Insert("pod", "ctr", res2, checkpoint.DevicesPerNUMA{0: {"b"}}, newResp())
			l.DeleteContainerResources(tc.pod, tc.ctr, tc.resources...)
			assert.Equal(t, tc.wantPods, l.Len())
			assert.Equal(t, tc.wantRes1, l.Allocated(res1))
			assert.Equal(t, tc.wantRes2, l.Allocated(res2))
			entries, err := l.ToCheckpoint()
			require.NoError(t, err)
			assert.Len(t, entries, tc.wantRes1.Len()+tc.wantRes2.Len())
		})
	}
}

// Upstream TestGetPodAndContainerForDevice, in our words, extended: the lookup
// is scoped to the resource and returns every owner.
func TestOwners(t *testing.T) {
	l := NewLedger()
	l.Insert("pod1", "con1", res1, checkpoint.DevicesPerNUMA{0: {"dev1"}, 1: {"dev1"}}, newResp())
	l.Insert("pod2", "con1", res2, checkpoint.DevicesPerNUMA{0: {"dev1"}}, newResp())
	// a regular init container and an app container of one pod share dev9
	l.Insert("pod3", "main", res1, checkpoint.DevicesPerNUMA{0: {"dev9"}}, newResp())
	l.Insert("pod3", "init", res1, checkpoint.DevicesPerNUMA{0: {"dev9"}}, newResp())

	cases := []struct {
		name string
		res  string
		id   string
		want []ContainerRef
	}{
		{"unknown device", res1, "dev2", nil},
		{"device on two NUMA nodes has one owner", res1, "dev1", []ContainerRef{{"pod1", "con1"}}},
		{"same ID under another resource", res2, "dev1", []ContainerRef{{"pod2", "con1"}}},
		{"unknown resource", "domain3.com/resource3", "dev1", nil},
		{"shared device: every owner, sorted", res1, "dev9", []ContainerRef{{"pod3", "init"}, {"pod3", "main"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, l.Owners(tc.res, tc.id))
		})
	}
	// a checkpoint may give one device to two pods; every owner is reported
	l.Insert("pod0", "x", res2, checkpoint.DevicesPerNUMA{0: {"dev1"}}, newResp())
	assert.Equal(t, []ContainerRef{{"pod0", "x"}, {"pod2", "con1"}}, l.Owners(res2, "dev1"))

	l.DeleteContainerResources("pod3", "init", res1)
	assert.Equal(t, []ContainerRef{{"pod3", "main"}}, l.Owners(res1, "dev9"), "reference kept by the other owner")
	assert.True(t, l.IsAllocated(res1, "dev9"))
}

// Device IDs are whatever the plugin sent: they are kept byte for byte, and
// the same ID under two resources is two devices.
func TestOddDeviceIDs(t *testing.T) {
	ids := []string{
		"",
		"nul\x00inside",
		"ctl\x01\x1b[31m\n\t",
		"invalid-utf8-\xff\xfe",
		strings.Repeat("long", 4096),
		"ünïcödé/設備",
	}
	l := NewLedger()
	for i, id := range ids {
		pod := string(rune('a' + i))
		l.Insert(pod, "ctr", res1, checkpoint.DevicesPerNUMA{0: {id}}, newResp())
		l.Insert(pod, "ctr", res2, checkpoint.DevicesPerNUMA{NoTopology: {id}}, newResp())
	}
	for i, id := range ids {
		pod := string(rune('a' + i))
		assert.True(t, l.IsAllocated(res1, id))
		assert.True(t, l.IsAllocated(res2, id))
		assert.Equal(t, []ContainerRef{{pod, "ctr"}}, l.Owners(res1, id))
		assert.Equal(t, sets.New(id), l.ContainerDevices(pod, "ctr", res2))
	}
	assert.Equal(t, sets.New(ids...), l.Allocated(res1))

	entries, err := l.ToCheckpoint()
	require.NoError(t, err)
	restored := NewLedger()
	require.NoError(t, restored.FromCheckpoint(entries))
	again, err := restored.ToCheckpoint()
	require.NoError(t, err)
	assert.Equal(t, entries, again)
	assert.Equal(t, sets.New(ids...), restored.Allocated(res2))

	l.DeleteContainerResources("b", "ctr", res1)
	assert.False(t, l.IsAllocated(res1, ids[1]))
	assert.True(t, l.IsAllocated(res2, ids[1]), "the other resource's device with the same ID stays")
}

func TestDevicesIncludesRecordsWithoutResponse(t *testing.T) {
	l := NewLedger()
	l.Insert("pod", "ctr", res1, checkpoint.DevicesPerNUMA{0: {"a"}}, nil)
	l.Insert("pod", "ctr", res2, nil, newResp())
	assert.Equal(t, map[string]sets.Set[string]{res1: sets.New("a"), res2: sets.New[string]()}, l.devices())
	assert.True(t, proto.Equal(newResp(), l.pods["pod"]["ctr"][res2].resp))
}

func TestHoldingsInAdmissionOrder(t *testing.T) {
	l := NewLedger()
	l.Insert("pod2", "ctr1", res1, checkpoint.DevicesPerNUMA{0: {"d4"}}, newResp())
	l.Insert("pod1", "ctr2", res2, checkpoint.DevicesPerNUMA{0: {"d2", "d1"}, 1: {"d1"}}, newResp())
	l.Insert("pod3", "ctr1", res1, checkpoint.DevicesPerNUMA{0: {"d5"}}, newResp())
	l.Insert("pod1", "ctr1", res1, checkpoint.DevicesPerNUMA{NoTopology: {"d3"}}, nil)
	_, err := l.Reserve("pod1", "ctr3", res1, []string{"d6"})
	require.NoError(t, err)

	got := l.Holdings("pod1", "pod2", "unknown")
	assert.Equal(t, []Holding{
		{PodUID: "pod2", ContainerName: "ctr1", Resource: res1, DeviceIDs: []string{"d4"}},
		{PodUID: "pod1", ContainerName: "ctr2", Resource: res2, DeviceIDs: []string{"d1", "d2"}},
		{PodUID: "pod1", ContainerName: "ctr1", Resource: res1, DeviceIDs: []string{"d3"}},
	}, got, "records only, no reservation, in admission order")

	got[0].DeviceIDs[0] = "changed"
	assert.Equal(t, sets.New("d4"), l.ContainerDevices("pod2", "ctr1", res1), "the IDs are a copy")
	assert.Empty(t, l.Holdings("unknown"))
}
