package podstate

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
)

func TestContainerMapIsRunning(t *testing.T) {
	m := ContainerMap{
		"id-old": {PodUID: "pod1", ContainerName: "ctr"},
		"id-new": {PodUID: "pod1", ContainerName: "ctr"},
		"id-2":   {PodUID: "pod2", ContainerName: "ctr"},
	}
	cases := []struct {
		name    string
		m       ContainerMap
		pod     string
		ctr     string
		running sets.Set[string]
		want    bool
	}{
		{"any of several IDs running counts", m, "pod1", "ctr", sets.New("id-new"), true},
		{"other ID of the same container", m, "pod1", "ctr", sets.New("id-old"), true},
		{"running ID belongs to another pod", m, "pod1", "ctr", sets.New("id-2"), false},
		{"container name must match", m, "pod2", "other", sets.New("id-2"), false},
		{"nothing running", m, "pod1", "ctr", nil, false},
		{"nil map", nil, "pod1", "ctr", sets.New("id-new"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.m.IsRunning(tc.pod, tc.ctr, tc.running))
		})
	}
}

func TestResourceDeviceInstancesClone(t *testing.T) {
	d := &pluginapi.Device{ID: "d1"}
	orig := ResourceDeviceInstances{"r": {"d1": d}}
	c := orig.Clone()
	require.Equal(t, orig, c)
	c["r"]["d2"] = &pluginapi.Device{ID: "d2"}
	c["other"] = DeviceInstances{}
	assert.Len(t, orig["r"], 1, "inner map copied")
	assert.NotContains(t, orig, "other", "outer map copied")
	assert.Same(t, d, c["r"]["d1"], "devices shared")
	assert.NotNil(t, ResourceDeviceInstances(nil).Clone())
}

// Upstream TestResourceDeviceInstanceFilter, in our words: the JSON of the
// filtered map is exact (encoding/json sorts map keys).
func TestResourceDeviceInstanceFilter(t *testing.T) {
	devs := ResourceDeviceInstances{}
	for _, res := range []string{"foo", "bar", "baz"} {
		devs[res] = DeviceInstances{}
		for _, n := range []string{"1", "2", "3"} {
			devs[res]["dev-"+res+n] = &pluginapi.Device{ID: res + n}
		}
	}
	all := `{"bar":{"dev-bar1":{"ID":"bar1"},"dev-bar2":{"ID":"bar2"},"dev-bar3":{"ID":"bar3"}},` +
		`"baz":{"dev-baz1":{"ID":"baz1"},"dev-baz2":{"ID":"baz2"},"dev-baz3":{"ID":"baz3"}},` +
		`"foo":{"dev-foo1":{"ID":"foo1"},"dev-foo2":{"ID":"foo2"},"dev-foo3":{"ID":"foo3"}}}`
	cases := []struct {
		name string
		cond map[string]sets.Set[string]
		want string
	}{
		{"empty condition", map[string]sets.Set[string]{}, `{}`},
		{"nil condition", nil, `{}`},
		{"partial", map[string]sets.Set[string]{
			"foo": sets.New("dev-foo1", "dev-foo2"),
			"bar": sets.New("dev-bar1"),
		}, `{"bar":{"dev-bar1":{"ID":"bar1"}},"foo":{"dev-foo1":{"ID":"foo1"},"dev-foo2":{"ID":"foo2"}}}`},
		{"everything", map[string]sets.Set[string]{
			"foo": sets.New("dev-foo1", "dev-foo2", "dev-foo3"),
			"bar": sets.New("dev-bar1", "dev-bar2", "dev-bar3"),
			"baz": sets.New("dev-baz1", "dev-baz2", "dev-baz3"),
		}, all},
		{"unknown IDs ignored", map[string]sets.Set[string]{
			"foo": sets.New("dev-foo1", "dev-foo2", "dev-foo3", "dev-foo4"),
			"bar": sets.New("dev-bar1", "dev-bar2", "dev-bar3", "dev-bar4"),
			"baz": sets.New("dev-baz1", "dev-baz2", "dev-baz3", "dev-bar4"),
		}, all},
		{"sparse", map[string]sets.Set[string]{
			"foo": sets.New("dev-foo1", "dev-foo4", "dev-foo7"),
			"bar": sets.New("dev-bar1", "dev-bar4", "dev-bar7"),
			"baz": sets.New("dev-baz1", "dev-baz4", "dev-baz7"),
		}, `{"bar":{"dev-bar1":{"ID":"bar1"}},"baz":{"dev-baz1":{"ID":"baz1"}},"foo":{"dev-foo1":{"ID":"foo1"}}}`},
		{"unknown resource omitted, known one with no match empty", map[string]sets.Set[string]{
			"qux": sets.New("dev-qux1"),
			"foo": sets.New("dev-foo9"),
		}, `{"foo":{}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.Marshal(devs.Filter(tc.cond))
			require.NoError(t, err)
			assert.JSONEq(t, tc.want, string(got))
			assert.Equal(t, tc.want, string(got), "exact bytes")
		})
	}
}

func TestNUMAMap(t *testing.T) {
	devs := DeviceInstances{
		"a":     numaDev("a", 1),
		"b":     numaDev("b", 0),
		"multi": numaDev("multi", 1, 0, 1),
		"none":  numaDev("none"),
		"empty": {ID: "empty", Topology: &pluginapi.TopologyInfo{}},
		"nilnd": {ID: "nilnd", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{nil}}},
	}
	cases := []struct {
		name string
		ids  []string
		want checkpoint.DevicesPerNUMA
	}{
		{"nothing", nil, checkpoint.DevicesPerNUMA{}},
		{"single nodes, lists sorted", []string{"a", "b"}, checkpoint.DevicesPerNUMA{0: {"b"}, 1: {"a"}}},
		{"multi-node device under every node once", []string{"multi", "a"},
			checkpoint.DevicesPerNUMA{0: {"multi"}, 1: {"a", "multi"}}},
		{"no topology, empty nodes, nil node and unknown device under -1",
			[]string{"unknown", "none", "empty", "nilnd"},
			checkpoint.DevicesPerNUMA{NoTopology: {"empty", "nilnd", "none", "unknown"}}},
		{"repeated ID listed once", []string{"a", "a"}, checkpoint.DevicesPerNUMA{1: {"a"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, NUMAMap(tc.ids, devs))
		})
	}
}
