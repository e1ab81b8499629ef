package podstate

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
)

func topo(nodes ...int64) *pluginapi.Device {
	d := &pluginapi.Device{Topology: &pluginapi.TopologyInfo{}}
	for _, n := range nodes {
		d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: n})
	}
	return d
}

// Upstream TestGetContainerDevices, in our words, plus the edge cases of the
// view: node order is ascending, -1 alone means no topology.
func TestDeviceView(t *testing.T) {
	cases := []struct {
		name string
		numa checkpoint.DevicesPerNUMA
		want DeviceInstances
	}{
		{"device on two NUMA nodes reports both, ascending",
			checkpoint.DevicesPerNUMA{1: {"dev1"}, 0: {"dev1"}},
			DeviceInstances{"dev1": topo(0, 1)}},
		{"devices on separate nodes", checkpoint.DevicesPerNUMA{0: {"a"}, 3: {"b"}},
			DeviceInstances{"a": topo(0), "b": topo(3)}},
		{"no topology", checkpoint.DevicesPerNUMA{NoTopology: {"x"}},
			DeviceInstances{"x": {}}},
		{"-1 next to a real node is ignored", checkpoint.DevicesPerNUMA{NoTopology: {"x"}, 2: {"x"}},
			DeviceInstances{"x": topo(2)}},
		{"repeated ID in one list", checkpoint.DevicesPerNUMA{0: {"x", "x"}},
			DeviceInstances{"x": topo(0)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger()
			l.Insert("pod", "ctr", res1, tc.numa, newResp())
			view := l.DeviceView("pod", "ctr")
			require.Len(t, view, 1)
			got := view[res1]
			require.Len(t, got, len(tc.want))
			for id, want := range tc.want {
				assert.Truef(t, proto.Equal(want, got[id]), "%s: want %v, got %v", id, want, got[id])
			}
		})
	}

	l := NewLedger()
	l.Insert("pod", "ctr", res1, checkpoint.DevicesPerNUMA{0: {"a"}}, newResp())
	l.Insert("pod", "ctr", res2, checkpoint.DevicesPerNUMA{}, newResp())
	l.Insert("pod", "ctr", "r3", checkpoint.DevicesPerNUMA{0: {}}, newResp())
	view := l.DeviceView("pod", "ctr")
	assert.Equal(t, []string{res1}, keys(view), "records without devices are left out")
	assert.Nil(t, l.DeviceView("pod", "nope"))
	assert.Nil(t, l.DeviceView("nope", "ctr"))
	assert.NotNil(t, ledgerWith("pod", "ctr", res2).DeviceView("pod", "ctr"), "known container, no devices: empty, not nil")
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// ledgerWith returns a ledger with one record holding no device.
func ledgerWith(pod, ctr, res string) *Ledger {
	l := NewLedger()
	l.Insert(pod, ctr, res, nil, newResp())
	return l
}
