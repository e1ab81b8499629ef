package topology

import (
	"fmt"
	"maps"
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func maskPtr(nodes ...int) *BitMask {
	m := mask(nodes...)
	return &m
}

// censusTiers tiers the available devices (IDs that are not devices
// included) with a census of all the devices.
func censusTiers(affinity *BitMask, devices map[string]*pluginapi.Device, available sets.Set[string]) Tiers {
	c := CountDevices(maps.All(devices), len(devices), func(string) bool { return true })
	return c.Tiers(affinity, sets.List(available), available.Has)
}

// TestFilterByAffinity: the kubelet's example for filterByAffinity and the
// deterministic order devmgr adds, from the census and the reference.
func TestFilterByAffinity(t *testing.T) {
	example := deviceMap(numaDev("dev1", 1), numaDev("dev2", 1, 2), numaDev("dev3", 2), numaDev("dev4", 2), plainDev("dev5"))
	tests := []struct {
		name      string
		affinity  *BitMask
		devices   map[string]*pluginapi.Device
		available []string
		want      Tiers
	}{
		{
			name:      "kubelet example, dev1 and dev2 available",
			affinity:  maskPtr(2),
			devices:   example,
			available: []string{"dev1", "dev2"},
			want:      Tiers{Aligned: []string{"dev2"}, Unaligned: []string{"dev1"}},
		},
		{
			name:      "kubelet example, dev1 to dev4 available",
			affinity:  maskPtr(2),
			devices:   example,
			available: []string{"dev1", "dev2", "dev3", "dev4"},
			want:      Tiers{Aligned: []string{"dev2", "dev3", "dev4"}, Unaligned: []string{"dev1"}},
		},
		{
			name:      "kubelet example, everything available",
			affinity:  maskPtr(2),
			devices:   example,
			available: []string{"dev1", "dev2", "dev3", "dev4", "dev5"},
			want: Tiers{
				Aligned: []string{"dev2", "dev3", "dev4"}, Unaligned: []string{"dev1"}, NoTopology: []string{"dev5"},
			},
		},
		{
			name:     "nodes by ascending count, in-mask first, ties by node id; IDs within a node",
			affinity: maskPtr(0, 1),
			devices: deviceMap(
				numaDev("a0", 0), numaDev("b0", 0), numaDev("c0", 0), // node 0: 3
				numaDev("z1", 1),                   // node 1: 1
				numaDev("y2", 2), numaDev("x2", 2), // node 2: 2
				numaDev("b3", 3), numaDev("a3", 3), // node 3: 2
				plainDev("n2"), plainDev("n1"),
			),
			available: []string{"a0", "b0", "c0", "z1", "y2", "x2", "b3", "a3", "n2", "n1"},
			want: Tiers{
				Aligned:    []string{"z1", "a0", "b0", "c0"},
				Unaligned:  []string{"x2", "y2", "a3", "b3"},
				NoTopology: []string{"n1", "n2"},
			},
		},
		{
			name:      "a device touching the mask is aligned and listed once",
			affinity:  maskPtr(0),
			devices:   deviceMap(numaDev("m", 1, 0), numaDev("a", 1), numaDev("b", 1)),
			available: []string{"m", "a", "b"},
			want:      Tiers{Aligned: []string{"m"}, Unaligned: []string{"a", "b"}},
		},
		{
			name:      "a multi-node device goes under its first node in the walk",
			affinity:  maskPtr(0),
			devices:   deviceMap(numaDev("x", 1, 2), numaDev("p", 1), numaDev("q", 1)),
			available: []string{"x", "p", "q"},
			// node 2 (1 device) comes before node 1 (3 devices): x first.
			want: Tiers{Unaligned: []string{"x", "p", "q"}},
		},
		{
			name:      "counts are of available devices only",
			affinity:  maskPtr(0, 1),
			devices:   deviceMap(numaDev("a", 0), numaDev("b", 0), numaDev("c", 0), numaDev("d", 1), numaDev("e", 1)),
			available: []string{"a", "d", "e"},
			// node 0 has 1 available device, node 1 has 2.
			want: Tiers{Aligned: []string{"a", "d", "e"}},
		},
		{
			name:      "nil affinity: everything without topology, sorted",
			affinity:  nil,
			devices:   example,
			available: []string{"dev4", "dev1", "dev5"},
			want:      Tiers{NoTopology: []string{"dev1", "dev4", "dev5"}},
		},
		{
			name:      "resource without topology",
			affinity:  maskPtr(0),
			devices:   deviceMap(plainDev("b"), plainDev("a"), numaDev("c")),
			available: []string{"a", "b", "c"},
			want:      Tiers{NoTopology: []string{"a", "b", "c"}},
		},
		{
			name:     "missing, nil, empty and out-of-range devices have no topology",
			affinity: maskPtr(0),
			devices: map[string]*pluginapi.Device{
				"ok": numaDev("ok", 0), "far": numaDev("far", 5), "empty": numaDev("empty"),
				"neg": numaDev("neg", -1), "big": numaDev("big", 64, 99), "nil": nil,
			},
			available: []string{"ok", "far", "empty", "neg", "big", "nil", "ghost"},
			want: Tiers{
				Aligned:    []string{"ok"},
				Unaligned:  []string{"far"},
				NoTopology: []string{"big", "empty", "ghost", "neg", "nil"},
			},
		},
		{
			name:      "empty mask: nothing aligned",
			affinity:  maskPtr(),
			devices:   deviceMap(numaDev("a", 0), numaDev("b", 1)),
			available: []string{"a", "b"},
			want:      Tiers{Unaligned: []string{"a", "b"}},
		},
		{
			name:      "nothing available",
			affinity:  maskPtr(0),
			devices:   example,
			available: nil,
			want:      Tiers{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			available := sets.New(tc.available...)
			assert.Equal(t, tc.want, censusTiers(tc.affinity, tc.devices, available), "census")
			assert.Equal(t, tc.want, referenceTiers(tc.affinity, tc.devices, available), "reference")
		})
	}
}

// TestTopologyAlignedAllocationTiers: the tiering part of the kubelet's
// TestTopologyAlignedAllocation. Taking the first n devices of
// Aligned, then Unaligned, then NoTopology must give the kubelet's NUMA
// histogram.
func TestTopologyAlignedAllocationTiers(t *testing.T) {
	perNode := func(nodes, each int) map[string]*pluginapi.Device {
		devs := make(map[string]*pluginapi.Device)
		for n := range nodes {
			for i := range each {
				id := fmt.Sprintf("Dev%d-%d", n, i)
				devs[id] = numaDev(id, int64(n))
			}
		}
		return devs
	}
	tests := []struct {
		name     string
		devices  map[string]*pluginapi.Device
		affinity *BitMask
		request  int
		want     map[int]int // NUMA node (-1: none) -> devices taken
	}{
		{
			name:     "no topology",
			devices:  deviceMap(plainDev("Dev1"), plainDev("Dev2")),
			affinity: maskPtr(0),
			request:  1,
			want:     map[int]int{-1: 1},
		},
		{
			name:     "partial alignment",
			devices:  deviceMap(numaDev("Dev1", 0), numaDev("Dev2", 1), plainDev("Dev3")),
			affinity: maskPtr(1),
			request:  1,
			want:     map[int]int{1: 1},
		},
		{
			name:     "single-node hint takes all from that node",
			devices:  perNode(2, 4),
			affinity: maskPtr(1),
			request:  4,
			want:     map[int]int{1: 4},
		},
		{
			name:     "unsatisfiable: request 4, 3 per node",
			devices:  perNode(2, 3),
			affinity: maskPtr(0),
			request:  4,
			want:     map[int]int{0: 3, 1: 1},
		},
		{
			name:     "hint {1,3}, request 4",
			devices:  perNode(4, 2),
			affinity: maskPtr(1, 3),
			request:  4,
			want:     map[int]int{1: 2, 3: 2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tiers := censusTiers(tc.affinity, tc.devices, sets.KeySet(tc.devices))
			order := append(append(append([]string{}, tiers.Aligned...), tiers.Unaligned...), tiers.NoTopology...)
			assert.Len(t, order, len(tc.devices), "every available device in exactly one tier")
			got := make(map[int]int)
			for _, id := range order[:tc.request] {
				node := -1
				if d := tc.devices[id]; d.Topology != nil && len(d.Topology.Nodes) > 0 {
					node = int(d.Topology.Nodes[0].ID)
				}
				got[node]++
			}
			assert.Equal(t, tc.want, got)
		})
	}
}
