package topology

import (
	"fmt"
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

// benchRequest builds the resource: one device in ten is allocated.
func benchRequest(c benchCase) HintRequest {
	devices := make(map[string]*pluginapi.Device, c.devices)
	available := sets.New[string]()
	for i := range c.devices {
		id := fmt.Sprintf("dev-%06d", i)
		devices[id] = numaDev(id, int64(i%c.deviceNodes))
		if i%10 != 0 {
			available.Insert(id)
		}
	}
	return HintRequest{MachineNodes: seqNodes(c.machineNodes), Devices: devices, Available: available, Request: 4}
}

func BenchmarkGenerateHints(b *testing.B) {
	for _, c := range benchCases {
		r := benchRequest(c)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				GenerateHints(r.MachineNodes, r.Devices, r.Available, r.Reusable, r.Request)
			}
		})
	}
}

func BenchmarkResourceHints(b *testing.B) {
	for _, c := range benchCases {
		r := benchRequest(c)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ResourceHints(r)
			}
		})
	}
}

func BenchmarkFilterByAffinity(b *testing.B) {
	for _, c := range []benchCase{benchCases[0], benchCases[2]} {
		r := benchRequest(c)
		affinity := mask(0)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				FilterByAffinity(&affinity, r.Devices, r.Available)
			}
		})
	}
}
