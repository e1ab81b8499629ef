package podstate

import (
	"testing"

	"github.com/stretchr/testify/assert"
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
		{"single nodes", []string{"a", "b"}, checkpoint.DevicesPerNUMA{0: {"b"}, 1: {"a"}}},
		{"multi-node device under every node once", []string{"a", "multi"},
			checkpoint.DevicesPerNUMA{0: {"multi"}, 1: {"a", "multi"}}},
		{"no topology, empty nodes, nil node and unknown device under -1",
			[]string{"empty", "nilnd", "none", "unknown"},
			checkpoint.DevicesPerNUMA{NoTopology: {"empty", "nilnd", "none", "unknown"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, numaMap(tc.ids, devs))
		})
	}
}
