package topology

import (
	"fmt"
	"maps"
	"testing"

	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type benchCase struct {
	name         string
	devices      int
	machineNodes int
	deviceNodes  int // devices spread round-robin over nodes 0..deviceNodes-1
}

var benchCases = []benchCase{
	{name: "10000dev-2of2nodes", devices: 10000, machineNodes: 2, deviceNodes: 2},
	{name: "1000dev-8of8nodes", devices: 1000, machineNodes: 8, deviceNodes: 8},
	{name: "1000dev-16of16nodes", devices: 1000, machineNodes: 16, deviceNodes: 16},
	{name: "10000dev-2of64nodes", devices: 10000, machineNodes: 64, deviceNodes: 2},
	{name: "80000dev-2of34nodes", devices: 80000, machineNodes: 34, deviceNodes: 2},
}

// benchResource is the resource of a case, every device healthy, and one
// device in ten allocated.
type benchResource struct {
	machine   []int
	devices   map[string]*pluginapi.Device
	allocated sets.Set[string]
}

func newBenchResource(c benchCase) benchResource {
	r := benchResource{
		machine:   seqNodes(c.machineNodes),
		devices:   make(map[string]*pluginapi.Device, c.devices),
		allocated: sets.New[string](),
	}
	for i := range c.devices {
		id := fmt.Sprintf("dev-%06d", i)
		r.devices[id] = numaDev(id, int64(i%c.deviceNodes))
		if i%10 == 0 {
			r.allocated.Insert(id)
		}
	}
	return r
}

func (r benchResource) census() *Census {
	return CountDevices(maps.All(r.devices), len(r.devices), func(string) bool { return true })
}

// BenchmarkCountDevices: the one pass over the devices, once per change of
// the devices or their health.
func BenchmarkCountDevices(b *testing.B) {
	for _, c := range benchCases {
		r := newBenchResource(c)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r.census()
			}
		})
	}
}

// BenchmarkCensusHints: the hints of a request of four devices.
func BenchmarkCensusHints(b *testing.B) {
	for _, c := range benchCases {
		r := newBenchResource(c)
		census := r.census()
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				census.Hints(r.machine, r.allocated, nil, nil, 4)
			}
		})
	}
}

// BenchmarkCensusTiers: the tiers of the free devices for an affinity to
// node 0.
func BenchmarkCensusTiers(b *testing.B) {
	for _, c := range []benchCase{benchCases[0], benchCases[2]} {
		r := newBenchResource(c)
		census := r.census()
		ids := sets.List(sets.KeySet(r.devices))
		free := func(id string) bool { return !r.allocated.Has(id) }
		affinity := mask(0)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				census.Tiers(&affinity, ids, free)
			}
		})
	}
}
