package topology

import (
	"maps"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// containerCase describes one resource as the device manager sees it when a
// container asks for hints (the kubelet's GetTopologyHints).
type containerCase struct {
	name      string
	machine   []int // default {0,1}
	devices   []*pluginapi.Device
	unhealthy []string
	elsewhere []string // allocated to other containers or pods
	held      []string // already allocated to this container
	reusable  []string // reuse pool (allocated to a regular init container)
	request   int
	want      []Hint
}

// query asks for the hints of the case: the healthy devices are all but
// unhealthy, and elsewhere, held and the reuse pool are all allocated.
func (c containerCase) query() hintQuery {
	machine := c.machine
	if machine == nil {
		machine = []int{0, 1}
	}
	all := deviceMap(c.devices...)
	return hintQuery{
		machine:   machine,
		devices:   all,
		healthy:   sets.KeySet(all).Delete(c.unhealthy...),
		allocated: sets.New(c.elsewhere...).Insert(c.held...).Insert(c.reusable...),
		reusable:  setOrNil(c.reusable),
		held:      setOrNil(c.held),
		request:   c.request,
	}
}

// checkHints requires the census and the reference to answer q with want
// exactly, order included: nil and empty differ, and the order is the
// kubelet's enumeration order (by mask size, then in combination order of
// the candidate nodes).
func checkHints(t *testing.T, q hintQuery, want []Hint) {
	t.Helper()
	for _, answer := range []struct {
		by  string
		got []Hint
	}{{"census", q.censusHints()}, {"reference", referenceHints(q)}} {
		if want == nil {
			assert.Nil(t, answer.got, answer.by)
			continue
		}
		require.NotNil(t, answer.got, "%s: nil means no preference", answer.by)
		assert.Equal(t, want, answer.got, answer.by)
	}
}

func runContainerCases(t *testing.T, cases []containerCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { checkHints(t, tc.query(), tc.want) })
	}
}

// TestGetTopologyHints: the common cases of the kubelet's test of the same
// name on a two-node machine, with the candidate-node rule of 1.36 (only the
// nodes that carry devices are enumerated).
func TestGetTopologyHints(t *testing.T) {
	twoPerNode := []*pluginapi.Device{numaDev("Dev1", 0), numaDev("Dev2", 1), numaDev("Dev3", 0), numaDev("Dev4", 1)}
	runContainerCases(t, []containerCase{
		{
			name: "no device has topology: no preference",
			devices: []*pluginapi.Device{
				plainDev("Dev1"), plainDev("Dev2"), numaDev("Dev3"),
				{ID: "Dev4", Topology: &pluginapi.TopologyInfo{Nodes: nil}},
			},
			request: 1,
			want:    nil,
		},
		{
			name:    "only one device has topology: only its node is a candidate",
			devices: []*pluginapi.Device{plainDev("Dev1"), numaDev("Dev2", 1)},
			request: 1,
			want:    []Hint{hint(true, 1)},
		},
		{
			name:    "one device per node, request 1",
			devices: []*pluginapi.Device{numaDev("Dev1", 0), numaDev("Dev2", 1)},
			request: 1,
			want:    []Hint{hint(true, 0), hint(true, 1), hint(false, 0, 1)},
		},
		{
			name:    "one device per node, request 2",
			devices: []*pluginapi.Device{numaDev("Dev1", 0), numaDev("Dev2", 1)},
			request: 2,
			want:    []Hint{hint(true, 0, 1)},
		},
		{
			name:    "two devices per node, request 2",
			devices: twoPerNode,
			request: 2,
			want:    []Hint{hint(true, 0), hint(true, 1), hint(false, 0, 1)},
		},
		{
			name:      "optimal on one node, forced cross-NUMA",
			devices:   twoPerNode,
			elsewhere: []string{"Dev1", "Dev2"},
			request:   2,
			want:      []Hint{hint(false, 0, 1)},
		},
		{
			name:    "two resources, mixed: the first",
			devices: twoPerNode,
			request: 2,
			want:    []Hint{hint(true, 0), hint(true, 1), hint(false, 0, 1)},
		},
		{
			name:    "two resources, mixed: the second, on node 0 only",
			devices: []*pluginapi.Device{numaDev("Dev1", 0)},
			request: 1,
			want:    []Hint{hint(true, 0)},
		},
		{
			name:    "more requested than available",
			devices: twoPerNode,
			request: 6,
			want:    []Hint{},
		},
		{
			name:    "container already holds its devices",
			devices: []*pluginapi.Device{numaDev("Dev1", 0), numaDev("Dev2", 0)},
			held:    []string{"Dev1", "Dev2"},
			request: 2,
			want:    []Hint{hint(true, 0)},
		},
		{
			name:    "container holds fewer devices than requested",
			devices: twoPerNode,
			held:    []string{"Dev1", "Dev2"},
			request: 4,
			want:    []Hint{},
		},
		{
			name:    "container holds more devices than requested",
			devices: twoPerNode,
			held:    []string{"Dev1", "Dev2", "Dev3", "Dev4"},
			request: 2,
			want:    []Hint{},
		},
	})
}

// TestHintsDecisions covers the kubelet's per-resource decision (no
// preference, impossible, or generated hints) beyond the kubelet's table.
func TestHintsDecisions(t *testing.T) {
	twoPerNode := []*pluginapi.Device{numaDev("Dev1", 0), numaDev("Dev2", 1), numaDev("Dev3", 0), numaDev("Dev4", 1)}
	runContainerCases(t, []containerCase{
		{
			name:    "held devices are regenerated alone, other free devices ignored",
			devices: twoPerNode,
			held:    []string{"Dev1", "Dev2"},
			request: 2,
			// Dev3 and Dev4 are free, yet only {0,1} holds the container's
			// devices; node 0 alone could hold 2 devices, so {0} would be
			// preferred, but {0,1} is not.
			want: []Hint{hint(false, 0, 1)},
		},
		{
			name:     "held devices ignore the reuse pool",
			devices:  twoPerNode,
			held:     []string{"Dev1", "Dev3"},
			reusable: []string{"Dev2"},
			request:  2,
			want:     []Hint{hint(true, 0), hint(false, 0, 1)},
		},
		{
			name:     "reuse pool counts toward availability",
			devices:  twoPerNode,
			reusable: []string{"Dev1", "Dev2"},
			request:  4,
			want:     []Hint{hint(true, 0, 1)},
		},
		{
			name:      "available plus reuse pool short of the request",
			devices:   twoPerNode,
			elsewhere: []string{"Dev3", "Dev4"},
			reusable:  []string{"Dev1"},
			request:   3,
			want:      []Hint{},
		},
		{
			name:      "unhealthy devices still decide what is preferred",
			devices:   twoPerNode,
			unhealthy: []string{"Dev3"},
			request:   2,
			want:      []Hint{hint(true, 1), hint(false, 0, 1)},
		},
		{
			name:    "empty held set means none held",
			devices: twoPerNode,
			held:    []string{},
			request: 1,
			want:    []Hint{hint(true, 0), hint(true, 1), hint(false, 0, 1)},
		},
		{
			name:    "machine without NUMA nodes: no preference",
			machine: []int{},
			devices: twoPerNode,
			request: 1,
			want:    nil,
		},
		{
			name:    "machine with only ids beyond 63: no preference",
			machine: []int{64, 65},
			devices: twoPerNode,
			request: 1,
			want:    nil,
		},
		{
			name:    "request 0 fits every mask",
			devices: []*pluginapi.Device{numaDev("Dev1", 0), numaDev("Dev2", 1)},
			request: 0,
			want:    []Hint{hint(true, 0), hint(true, 1), hint(false, 0, 1)},
		},
	})
}

// maskCase is a question put to Census.Hints as is, every device healthy.
type maskCase struct {
	name                      string
	machine                   []int
	devices                   map[string]*pluginapi.Device
	allocated, reusable, held []string
	request                   int
	want                      []Hint
}

func runMaskCases(t *testing.T, cases []maskCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkHints(t, hintQuery{
				machine:   tc.machine,
				devices:   tc.devices,
				healthy:   sets.KeySet(tc.devices),
				allocated: sets.New(tc.allocated...),
				reusable:  setOrNil(tc.reusable),
				held:      setOrNil(tc.held),
				request:   tc.request,
			}, tc.want)
		})
	}
}

func setOrNil(ids []string) sets.Set[string] {
	if ids == nil {
		return nil
	}
	return sets.New(ids...)
}

// TestHintsDeviceShapes covers devices the kubelet would panic on or that
// stress the signature counting.
func TestHintsDeviceShapes(t *testing.T) {
	nilEntry := &pluginapi.Device{ID: "nilEntry", Topology: &pluginapi.TopologyInfo{
		Nodes: []*pluginapi.NUMANode{nil, {ID: 1}},
	}}
	onlyNilEntry := &pluginapi.Device{ID: "onlyNil", Topology: &pluginapi.TopologyInfo{
		Nodes: []*pluginapi.NUMANode{nil},
	}}
	runMaskCases(t, []maskCase{
		{
			name:    "a device on two nodes counts once per mask",
			machine: []int{0, 1},
			devices: deviceMap(numaDev("a", 0, 1), numaDev("b", 1)),
			request: 2,
			// {1} holds a and b; {0,1} holds them once each, not three.
			want: []Hint{hint(true, 1), hint(false, 0, 1)},
		},
		{
			name:    "a device on two nodes does not double the count",
			machine: []int{0, 1, 2},
			devices: deviceMap(numaDev("a", 0, 1), numaDev("c", 2)),
			request: 2,
			// {0,1} holds a alone.
			want: []Hint{hint(true, 0, 2), hint(true, 1, 2), hint(false, 0, 1, 2)},
		},
		{
			name:    "held ID the census does not know has no topology",
			machine: []int{0, 1},
			devices: deviceMap(numaDev("a", 0)),
			held:    []string{"a", "ghost"},
			request: 2,
			want:    []Hint{},
		},
		{
			name:     "reusable ID the census does not know is ignored",
			machine:  []int{0, 1},
			devices:  deviceMap(numaDev("a", 0)),
			reusable: []string{"ghost"},
			request:  1,
			want:     []Hint{hint(true, 0)},
		},
		{
			name:      "reusable device with nil topology is ignored",
			machine:   []int{0, 1},
			devices:   deviceMap(numaDev("a", 0), plainDev("r")),
			allocated: []string{"r"},
			reusable:  []string{"r"},
			request:   1,
			want:      []Hint{hint(true, 0)},
		},
		{
			name:      "reusable device with an empty node list rejects every mask",
			machine:   []int{0, 1},
			devices:   deviceMap(numaDev("a", 0), numaDev("b", 1), numaDev("r")),
			allocated: []string{"r"},
			reusable:  []string{"r"},
			request:   1,
			want:      []Hint{},
		},
		{
			name:      "reusable device on a node unknown to the machine rejects every mask",
			machine:   []int{0, 1},
			devices:   deviceMap(numaDev("a", 0), numaDev("r", 5)),
			allocated: []string{"r"},
			reusable:  []string{"r"},
			request:   1,
			want:      []Hint{},
		},
		{
			name:      "reusable device on node 99 rejects every mask",
			machine:   []int{0, 1},
			devices:   deviceMap(numaDev("a", 0), numaDev("r", 99)),
			allocated: []string{"r"},
			reusable:  []string{"r"},
			request:   1,
			want:      []Hint{},
		},
		{
			name:      "reusable device pins masks to its node",
			machine:   []int{0, 1, 2},
			devices:   deviceMap(numaDev("a", 0), numaDev("b", 1), numaDev("c", 2), numaDev("r", 1)),
			allocated: []string{"r"},
			reusable:  []string{"r"},
			request:   2,
			want:      []Hint{hint(true, 1), hint(false, 0, 1), hint(false, 1, 2), hint(false, 0, 1, 2)},
		},
		{
			name:     "a device both reusable and available counts once",
			machine:  []int{0, 1},
			devices:  deviceMap(numaDev("a", 0), numaDev("b", 1)),
			reusable: []string{"a"},
			request:  2,
			want:     []Hint{hint(true, 0, 1)},
		},
		{
			name:    "node ids outside 0..63 never match",
			machine: []int{0, 1},
			devices: deviceMap(numaDev("a", 0), numaDev("neg", -1), numaDev("big", 64), numaDev("huge", 1<<40)),
			request: 1,
			want:    []Hint{hint(true, 0)},
		},
		{
			name:    "only ids outside the machine: fall back to machine nodes, nothing fits",
			machine: []int{0, 1},
			devices: deviceMap(numaDev("a", 99), numaDev("b", -1), numaDev("c", 7)),
			request: 1,
			want:    []Hint{},
		},
		{
			name:    "fallback keeps the machine's order",
			machine: []int{3, 1, 70},
			devices: deviceMap(numaDev("a", 99)),
			request: 0,
			want:    []Hint{hint(true, 3), hint(true, 1), hint(false, 1, 3)},
		},
		{
			name:    "nil device and nil node entries",
			machine: []int{0, 1},
			devices: map[string]*pluginapi.Device{"nilDev": nil, "nilEntry": nilEntry, "onlyNil": onlyNilEntry},
			request: 1,
			want:    []Hint{hint(true, 1)},
		},
		{
			name:    "multi-node devices lower the preferred size only when they fit",
			machine: []int{0, 1, 2, 3},
			devices: deviceMap(numaDev("a", 0, 1), numaDev("b", 1, 2), numaDev("c", 3),
				numaDev("d", 2, 3)),
			allocated: []string{"b", "d"},
			request:   2,
			// {1} holds a and b, {2} holds b and d: the narrowest possible
			// placement has one node, but only a and c are free.
			want: []Hint{
				hint(false, 0, 3), hint(false, 1, 3),
				hint(false, 0, 1, 3), hint(false, 0, 2, 3), hint(false, 1, 2, 3),
				hint(false, 0, 1, 2, 3),
			},
		},
	})
}

// TestDeviceNUMANodes: the nodes carrying devices, as candidates (the
// kubelet's test of the same name).
func TestDeviceNUMANodes(t *testing.T) {
	tests := []struct {
		name    string
		machine []int
		devices map[string]*pluginapi.Device
		want    []int
	}{
		{
			name:    "devices on 3 and 5 of 0,3,5,7",
			machine: []int{0, 3, 5, 7},
			devices: deviceMap(numaDev("a", 3), numaDev("b", 5), numaDev("c", 5)),
			want:    []int{3, 5},
		},
		{
			name:    "a device without topology is ignored",
			machine: []int{0, 3, 5, 7},
			devices: deviceMap(numaDev("a", 5), plainDev("b"), numaDev("c")),
			want:    []int{5},
		},
		{
			name:    "no topology at all",
			machine: []int{0, 3, 5, 7},
			devices: deviceMap(plainDev("a"), numaDev("b")),
			want:    nil,
		},
		{
			name:    "NUMA id unknown to the machine is dropped",
			machine: []int{0, 3, 5, 7},
			devices: deviceMap(numaDev("a", 3), numaDev("b", 99), numaDev("c", 1), numaDev("d", -1)),
			want:    []int{3},
		},
		{
			name:    "sorted whatever the machine order",
			machine: []int{7, 5, 3, 0},
			devices: deviceMap(numaDev("a", 7), numaDev("b", 0, 5)),
			want:    []int{0, 5, 7},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := CountDevices(maps.All(tc.devices), len(tc.devices), func(string) bool { return false })
			got := deviceNUMANodes(tc.machine, c.t.nodes)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestGenerateDeviceTopologyHintsFiltersNUMANodes: the cases of the kubelet's
// test of the same name, a 34-node machine and reusable devices among them.
func TestGenerateDeviceTopologyHintsFiltersNUMANodes(t *testing.T) {
	runMaskCases(t, []maskCase{
		{
			name:    "34 machine nodes, GPUs on 0 and 1",
			machine: seqNodes(34),
			devices: deviceMap(numaDev("gpu0", 0), numaDev("gpu1", 1)),
			request: 1,
			want:    []Hint{hint(true, 0), hint(true, 1), hint(false, 0, 1)},
		},
		{
			name:    "34 machine nodes, GPUs on 20 and 33",
			machine: seqNodes(34),
			devices: deviceMap(numaDev("gpu0", 33), numaDev("gpu1", 20)),
			request: 2,
			want:    []Hint{hint(true, 20, 33)},
		},
		{
			name:      "reusable only, on node 0 of 0..3",
			machine:   []int{0, 1, 2, 3},
			devices:   deviceMap(numaDev("a", 0)),
			allocated: []string{"a"},
			reusable:  []string{"a"},
			request:   1,
			want:      []Hint{hint(true, 0)},
		},
		{
			name:      "reusable on 0 plus available on 1",
			machine:   []int{0, 1, 2, 3},
			devices:   deviceMap(numaDev("a", 0), numaDev("b", 1)),
			allocated: []string{"a"},
			reusable:  []string{"a"},
			request:   2,
			want:      []Hint{hint(true, 0, 1)},
		},
		{
			name:    "device-less nodes between device nodes are skipped",
			machine: seqNodes(8),
			devices: deviceMap(numaDev("a", 2), numaDev("b", 6)),
			request: 1,
			want:    []Hint{hint(true, 2), hint(true, 6), hint(false, 2, 6)},
		},
	})
}

// TestGetPodTopologyHints: pod scope, the kubelet's cases: requests from
// PodRequests, held = the pod's devices, no reuse pool.
func TestGetPodTopologyHints(t *testing.T) {
	limits := func(kv ...any) v1.ResourceRequirements {
		l := v1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			l[v1.ResourceName(kv[i].(string))] = resource.MustParse(kv[i+1].(string))
		}
		return v1.ResourceRequirements{Limits: l}
	}
	fourDevices := func() []*pluginapi.Device {
		return []*pluginapi.Device{numaDev("Dev1", 0), numaDev("Dev2", 0), numaDev("Dev3", 1), numaDev("Dev4", 1)}
	}
	registered := []string{"testdevice1", "testdevice2"}
	spread := []Hint{hint(true, 0), hint(true, 1), hint(false, 0, 1)}

	tests := []struct {
		name      string
		pod       v1.PodSpec
		elsewhere map[string][]string // resource -> devices of another pod
		held      map[string][]string // resource -> devices of this pod
		want      map[string][]Hint
	}{
		{
			name: "two resources over three containers, one unregistered",
			pod: v1.PodSpec{Containers: []v1.Container{
				{Name: "c1", Resources: limits("testdevice1", "2")},
				{Name: "c2", Resources: limits("testdevice2", "2")},
				{Name: "c3", Resources: limits("notRegistered", "2")},
			}},
			want: map[string][]Hint{"testdevice1": spread, "testdevice2": spread},
		},
		{
			name: "init containers and app containers",
			pod: v1.PodSpec{
				InitContainers: []v1.Container{
					{Name: "i1", Resources: limits("testdevice1", "1", "testdevice2", "1")},
					{Name: "i2", Resources: limits("testdevice1", "1", "testdevice2", "2")},
				},
				Containers: []v1.Container{
					{Name: "c1", Resources: limits("testdevice1", "1", "testdevice2", "1")},
					{Name: "c2", Resources: limits("testdevice1", "1", "testdevice2", "1")},
					{Name: "c3", Resources: limits("notRegistered", "1")},
				},
			},
			want: map[string][]Hint{"testdevice1": spread, "testdevice2": spread},
		},
		{
			name: "another pod's devices force cross-NUMA",
			pod: v1.PodSpec{Containers: []v1.Container{
				{Name: "c1", Resources: limits("testdevice1", "1", "testdevice2", "1")},
				{Name: "c2", Resources: limits("testdevice1", "1", "testdevice2", "1")},
				{Name: "c3", Resources: limits("notRegistered", "1")},
			}},
			elsewhere: map[string][]string{"testdevice1": {"Dev1", "Dev3"}, "testdevice2": {"Dev1", "Dev3"}},
			want: map[string][]Hint{
				"testdevice1": {hint(false, 0, 1)},
				"testdevice2": {hint(false, 0, 1)},
			},
		},
		{
			name: "pod already holds its devices",
			pod: v1.PodSpec{Containers: []v1.Container{
				{Name: "c1", Resources: limits("testdevice1", "1")},
				{Name: "c2", Resources: limits("testdevice1", "1")},
			}},
			held: map[string][]string{"testdevice1": {"Dev3", "Dev4"}},
			want: map[string][]Hint{"testdevice1": {hint(true, 1), hint(false, 0, 1)}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			asked := sets.New[string]()
			for res, n := range PodRequests(&v1.Pod{Spec: tc.pod}) {
				if !sets.New(registered...).Has(res) {
					continue
				}
				asked.Insert(res)
				devs := deviceMap(fourDevices()...)
				checkHints(t, hintQuery{
					machine:   []int{0, 1},
					devices:   devs,
					healthy:   sets.KeySet(devs),
					allocated: sets.New(tc.elsewhere[res]...).Insert(tc.held[res]...),
					held:      setOrNil(tc.held[res]),
					request:   int(n),
				}, tc.want[res])
			}
			assert.Equal(t, sets.KeySet(tc.want), asked, "resources with hints")
		})
	}
}
