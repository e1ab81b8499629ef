package main

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/openkubelet/devmgr/plugintest"
)

// The resources of the demo's two fake plugins.
const (
	demoGPU = "example.com/gpu"
	demoNIC = "example.com/nic"
)

// demoNUMANodes are the NUMA nodes of the demo's imaginary machine.
var demoNUMANodes = []int{0, 1}

// demoPluginSpec describes one of the demo's built-in fake plugins.
type demoPluginSpec struct {
	resource string
	devices  []*pluginapi.Device
	preStart bool
	// policy names the plugin's preferred-allocation policy; "" means the
	// plugin offers no GetPreferredAllocation.
	policy string
	// cdi makes the plugin name one CDI device per allocated device.
	cdi bool
}

// demoPluginSpecs returns the demo's plugins: four GPUs enumerated
// alternately on NUMA nodes 0 and 1 (as many machines number them), packed on
// one NUMA node by the plugin's preferred allocation and named for CDI; and
// eight NICs, four per NUMA node, whose plugin asks for PreStartContainer.
func demoPluginSpecs() []demoPluginSpec {
	return []demoPluginSpec{
		{
			resource: demoGPU,
			devices:  demoDevices("gpu", 4, func(i int) int64 { return int64(i % 2) }),
			policy:   "pack on one NUMA node",
			cdi:      true,
		},
		{
			resource: demoNIC,
			devices:  demoDevices("nic", 8, func(i int) int64 { return int64(i / 4) }),
			preStart: true,
		},
	}
}

// demoDevices returns n healthy devices prefix-0 ... prefix-(n-1), device i
// on NUMA node numa(i).
func demoDevices(prefix string, n int, numa func(i int) int64) []*pluginapi.Device {
	devs := make([]*pluginapi.Device, 0, n)
	for i := range n {
		devs = append(devs, &pluginapi.Device{
			ID:       fmt.Sprintf("%s-%d", prefix, i),
			Health:   pluginapi.Healthy,
			Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: numa(i)}}},
		})
	}
	return devs
}

// packOnOneNUMANode is a GetPreferredAllocation policy: it answers each
// container request with packOnNUMA over the NUMA nodes of devices.
func packOnOneNUMANode(devices []*pluginapi.Device) plugintest.PreferredAllocationFunc {
	numaOf := make(map[string]int64, len(devices))
	for _, d := range devices {
		numaOf[d.GetID()] = -1
		if nodes := d.GetTopology().GetNodes(); len(nodes) > 0 {
			numaOf[d.GetID()] = nodes[0].GetID()
		}
	}
	return func(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
		resp := &pluginapi.PreferredAllocationResponse{}
		for _, cr := range req.GetContainerRequests() {
			ids := packOnNUMA(numaOf, cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize()))
			resp.ContainerResponses = append(resp.ContainerResponses,
				&pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
		}
		return resp, nil
	}
}

// packOnNUMA picks size device IDs: every must-include ID, then available IDs
// of a single NUMA node. That node is the one holding the must-include IDs,
// or else the node with the fewest available devices that still fits the
// request (best fit keeps whole nodes free for larger requests; ties go to
// the lower node). When no single node fits, the remaining IDs are taken in
// sorted order. Devices missing from numaOf count as node -1.
func packOnNUMA(numaOf map[string]int64, available, mustInclude []string, size int) []string {
	must := slices.Compact(slices.Sorted(slices.Values(mustInclude)))
	if len(must) >= size {
		return must
	}
	node := func(id string) int64 {
		if n, ok := numaOf[id]; ok {
			return n
		}
		return -1
	}
	rest := make([]string, 0, len(available))
	free := map[int64][]string{}
	for _, id := range slices.Compact(slices.Sorted(slices.Values(available))) {
		if _, isMust := slices.BinarySearch(must, id); isMust {
			continue
		}
		rest = append(rest, id)
		free[node(id)] = append(free[node(id)], id)
	}
	mustNodes := map[int64]bool{}
	for _, id := range must {
		mustNodes[node(id)] = true
	}
	need := size - len(must)
	best, found := int64(0), false
	for _, n := range slices.Sorted(maps.Keys(free)) {
		if len(mustNodes) > 1 || (len(mustNodes) == 1 && !mustNodes[n]) || len(free[n]) < need {
			continue
		}
		if !found || len(free[n]) < len(free[best]) {
			best, found = n, true
		}
	}
	if found {
		return append(must, free[best][:need]...)
	}
	return append(must, rest[:min(need, len(rest))]...)
}

// demoPodFile is one pod manifest of testdata/demo.
type demoPodFile struct {
	file string
	pod  *v1.Pod
}

// loadDemoPods reads every *.yaml pod manifest of fsys, in file-name order,
// and gives a UID to pods without one. Unknown fields are errors, so that a
// typo in a manifest does not go unnoticed.
func loadDemoPods(fsys fs.FS) ([]demoPodFile, error) {
	names, err := fs.Glob(fsys, "*.yaml")
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no pod manifests (*.yaml) found")
	}
	slices.Sort(names)
	out := make([]demoPodFile, 0, len(names))
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		pod := &v1.Pod{}
		if err := yaml.UnmarshalStrict(b, pod); err != nil {
			return nil, fmt.Errorf("pod manifest %s: %w", name, err)
		}
		if pod.Kind != "Pod" || pod.Name == "" {
			return nil, fmt.Errorf("pod manifest %s: want kind Pod with a metadata.name, got kind %q name %q", name, pod.Kind, pod.Name)
		}
		if pod.UID == "" {
			// The demo follows each pod by UID, so it needs one before
			// admission (which would otherwise make one up).
			pod.UID = uuid.NewUUID()
		}
		out = append(out, demoPodFile{file: name, pod: pod})
	}
	return out, nil
}

// Kinds of container, as the device manager treats them.
const (
	demoKindInit    = "init"    // a regular init container: its devices go back to the pod
	demoKindSidecar = "sidecar" // a restartable init container: keeps its devices
	demoKindApp     = "app"
)

// demoContainerKind returns the kind of the container named name in pod.
func demoContainerKind(pod *v1.Pod, name string) string {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == name {
			if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
				return demoKindSidecar
			}
			return demoKindInit
		}
	}
	return demoKindApp
}
