package devicemanager

// Tests of the upstream topology_hints_test.go (hints, and NUMA-aligned
// allocation with the plugin's preference) and of TestGetTopologyHintsWithUpdates
// from the kubelet's manager_test.go, through plugins and the public
// surface; see upstream_test.go. TestLifecycleGetTopologyHints and
// TestLifecycleGetPodTopologyHints have no counterpart: our hint methods take
// no operation argument.

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/topology"
)

// hintStrings renders hints best first (topology.Hint.LessThan), as
// "{<mask> <preferred>}" ("{01 true}": node 0, preferred). nil stays nil (no
// preference), an empty list stays empty (nothing fits).
func hintStrings(hs []topology.Hint) []string {
	if hs == nil {
		return nil
	}
	sorted := slices.Clone(hs)
	slices.SortStableFunc(sorted, func(a, b topology.Hint) int {
		switch {
		case a.LessThan(b):
			return -1
		case b.LessThan(a):
			return 1
		}
		return 0
	})
	out := make([]string, 0, len(sorted))
	for _, h := range sorted {
		out = append(out, h.String())
	}
	return out
}

func allHintStrings(hints map[string][]topology.Hint) map[string][]string {
	out := make(map[string][]string, len(hints))
	for res, hs := range hints {
		out[res] = hintStrings(hs)
	}
	return out
}

// The usual expectations on a machine with NUMA nodes 0 and 1.
var (
	eitherNode   = []string{"{01 true}", "{10 true}", "{11 false}"}
	bothNodes    = []string{"{11 true}"}
	crossForced  = []string{"{11 false}"}
	nothingFits  = []string{}
	noPreference []string
)

// hold is a container of some pod holding given devices before hints are
// asked.
type hold struct {
	pod, container, res string
	ids                 []string
}

func noTopologyDev(id string) *pluginapi.Device {
	return &pluginapi.Device{ID: id, Health: healthy, Topology: &pluginapi.TopologyInfo{}}
}

// hintCase is one scenario: plugins with devices (each offering
// GetPreferredAllocation, so that holds can be placed), containers holding
// devices, and the pod whose hints are asked.
type hintCase struct {
	name  string
	numa  []int // default {0, 1}
	devs  map[string][]*pluginapi.Device
	holds []hold
	// later replaces device lists after the holds are placed.
	later map[string][]*pluginapi.Device
	pod   *v1.Pod // UID "pod"
	want  map[string][]string
}

// setUp starts a manager for tc, registers its plugins and places its holds.
func (tc hintCase) setUp(t *testing.T) *harness {
	t.Helper()
	numa := tc.numa
	if numa == nil {
		numa = []int{0, 1}
	}
	h := newHarness(t, func(o *Options) { o.NUMANodes = numa }).start()
	plugins := map[string]*plugintest.Plugin{}
	for _, res := range sortedKeys(tc.devs) {
		plugins[res] = h.registered(res, tc.devs[res], withOptions(false, true))
	}
	h.pods.add(tc.pod)
	for _, hd := range tc.holds {
		pod := tc.pod
		if hd.pod != string(tc.pod.UID) {
			pod = newPod(hd.pod)
		}
		h.give(plugins[hd.res], pod, hd.container, hd.ids...)
	}
	for _, res := range sortedKeys(tc.later) {
		plugins[res].Update(tc.later[res])
		h.waitCapacity(res, int64(len(tc.later[res])), int64(countHealthy(tc.later[res])))
	}
	return h
}

// onePerNode is Dev1 on node 0 and Dev2 on node 1; twoPerNode adds Dev3 on
// node 0 and Dev4 on node 1.
func onePerNode() []*pluginapi.Device {
	return []*pluginapi.Device{dev("Dev1", healthy, 0), dev("Dev2", healthy, 1)}
}

func twoPerNode() []*pluginapi.Device {
	return []*pluginapi.Device{dev("Dev1", healthy, 0), dev("Dev2", healthy, 1), dev("Dev3", healthy, 0), dev("Dev4", healthy, 1)}
}

// Mirrors TestGetTopologyHints (container scope): nil for a
// resource without topology, an empty list when nothing fits, and the
// masks that fit otherwise, preferred when as narrow as possible. Resources
// no plugin serves are absent. Upstream builds the manager's maps by hand;
// here plugins report the devices and other containers hold devices through
// real allocations.
func TestContainerTopologyHints(t *testing.T) {
	appWithInit := newPod("pod", ctr("c", res1, 2))
	appWithInit.Spec.InitContainers = []v1.Container{ctr("init", res1, 1)}
	numa34 := make([]int, 34)
	for i := range numa34 {
		numa34[i] = i
	}
	for _, tc := range []hintCase{
		{
			name: "devices without topology: no preference",
			devs: map[string][]*pluginapi.Device{res1: {dev("Dev1", healthy), noTopologyDev("Dev2")}},
			pod:  newPod("pod", ctr("c", res1, 1)),
			want: map[string][]string{res1: noPreference},
		},
		{
			name: "only the node that has a device",
			devs: map[string][]*pluginapi.Device{res1: {dev("Dev1", healthy), dev("Dev2", healthy, 1)}},
			pod:  newPod("pod", ctr("c", res1, 1)),
			want: map[string][]string{res1: {"{10 true}"}},
		},
		{
			name: "one per node, request 1; other resources absent",
			devs: map[string][]*pluginapi.Device{res1: onePerNode()},
			pod:  newPod("pod", ctr("c", res1, 1, "cpu", 2, "vendor.com/none", 1)),
			want: map[string][]string{res1: eitherNode},
		},
		{
			name: "one per node, request 2",
			devs: map[string][]*pluginapi.Device{res1: onePerNode()},
			pod:  newPod("pod", ctr("c", res1, 2)),
			want: map[string][]string{res1: bothNodes},
		},
		{
			name: "two per node, request 2",
			devs: map[string][]*pluginapi.Device{res1: twoPerNode()},
			pod:  newPod("pod", ctr("c", res1, 2)),
			want: map[string][]string{res1: eitherNode},
		},
		{
			name:  "another container forces cross-NUMA",
			devs:  map[string][]*pluginapi.Device{res1: twoPerNode()},
			holds: []hold{{"other", "c", res1, []string{"Dev1", "Dev4"}}},
			pod:   newPod("pod", ctr("c", res1, 2)),
			want:  map[string][]string{res1: crossForced},
		},
		{
			name: "two resources, hints per resource",
			devs: map[string][]*pluginapi.Device{
				res1: onePerNode(),
				res2: {dev("Dev1", healthy, 0), dev("Dev2", healthy, 0)},
			},
			pod:  newPod("pod", ctr("c", res1, 1, res2, 2)),
			want: map[string][]string{res1: eitherNode, res2: {"{01 true}"}},
		},
		{
			name: "more requested than available",
			devs: map[string][]*pluginapi.Device{res1: twoPerNode()},
			pod:  newPod("pod", ctr("c", res1, 6)),
			want: map[string][]string{res1: nothingFits},
		},
		{
			name:  "container already holds the request",
			devs:  map[string][]*pluginapi.Device{res1: twoPerNode()},
			holds: []hold{{"pod", "c", res1, []string{"Dev1", "Dev3"}}},
			pod:   newPod("pod", ctr("c", res1, 2)),
			// Regenerated from the held devices only (both on node 0): node 1
			// alone cannot hold them, although its devices are free.
			want: map[string][]string{res1: {"{01 true}", "{11 false}"}},
		},
		{
			name:  "container holds fewer than it requests",
			devs:  map[string][]*pluginapi.Device{res1: twoPerNode()},
			holds: []hold{{"pod", "c", res1, []string{"Dev1", "Dev3"}}},
			pod:   newPod("pod", ctr("c", res1, 4)),
			want:  map[string][]string{res1: nothingFits},
		},
		{
			name:  "container holds more than it requests",
			devs:  map[string][]*pluginapi.Device{res1: twoPerNode()},
			holds: []hold{{"pod", "c", res1, []string{"Dev1", "Dev2", "Dev3", "Dev4"}}},
			pod:   newPod("pod", ctr("c", res1, 2)),
			want:  map[string][]string{res1: nothingFits},
		},
		{
			name:  "device reused from an init container pins its node",
			devs:  map[string][]*pluginapi.Device{res1: onePerNode()},
			holds: []hold{{"pod", "init", res1, []string{"Dev1"}}},
			pod:   appWithInit,
			want:  map[string][]string{res1: bothNodes},
		},
		{
			// Unlike the kubelet, which dereferences the missing
			// device and panics; devmgr treats it as having no topology.
			name:  "a reused device gone from the list has no topology",
			devs:  map[string][]*pluginapi.Device{res1: {dev("Dev1", healthy, 0), dev("Dev2", healthy, 1), dev("Dev3", healthy, 1)}},
			holds: []hold{{"pod", "init", res1, []string{"Dev1"}}},
			later: map[string][]*pluginapi.Device{res1: {dev("Dev2", healthy, 1), dev("Dev3", healthy, 1)}},
			pod:   appWithInit,
			want:  map[string][]string{res1: {"{10 true}"}},
		},
		{
			name: "only device-bearing NUMA nodes are enumerated",
			numa: numa34,
			devs: map[string][]*pluginapi.Device{res1: onePerNode()},
			pod:  newPod("pod", ctr("c", res1, 1)),
			want: map[string][]string{res1: eitherNode},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.setUp(t)
			got := h.m.GetTopologyHints(tc.pod, &tc.pod.Spec.Containers[0])
			assert.Equal(t, tc.want, allHintStrings(got))
			for res, want := range tc.want {
				assert.Equal(t, want == nil, got[res] == nil, "nil (no preference) and empty (nothing fits) differ: %s", res)
			}
		})
	}
}

// Mirrors TestGetPodTopologyHints (pod scope): requests are the
// pod's aggregated limits, devices held by any of its containers count as
// already allocated, and there is no reuse pool.
func TestPodTopologyHints(t *testing.T) {
	threeContainers := newPod("pod", ctr("c1", res1, 1), ctr("c2", res2, 1), ctr("c3", "vendor.com/none", 1))
	withInit := newPod("pod", ctr("c1", res1, 1), ctr("c2", res2, 1))
	withInit.Spec.InitContainers = []v1.Container{ctr("init", res1, 1, res2, 1)}
	withSidecar := newPod("pod", ctr("app", res1, 2))
	withSidecar.Spec.InitContainers = []v1.Container{ctr("sidecar", res1, 1)}
	withSidecar.Spec.InitContainers[0].RestartPolicy = restartable()
	for _, tc := range []hintCase{
		{
			name: "one container, one per node",
			devs: map[string][]*pluginapi.Device{res1: onePerNode()},
			pod:  newPod("pod", ctr("c", res1, 1)),
			want: map[string][]string{res1: eitherNode},
		},
		{
			name: "two resources over three containers, one unregistered",
			devs: map[string][]*pluginapi.Device{res1: onePerNode(), res2: onePerNode()},
			pod:  threeContainers,
			want: map[string][]string{res1: eitherNode, res2: eitherNode},
		},
		{
			name: "with an init container",
			devs: map[string][]*pluginapi.Device{res1: onePerNode(), res2: onePerNode()},
			pod:  withInit,
			want: map[string][]string{res1: eitherNode, res2: eitherNode},
		},
		{
			name: "a sidecar adds to the app containers",
			devs: map[string][]*pluginapi.Device{res1: twoPerNode()},
			pod:  withSidecar,
			want: map[string][]string{res1: bothNodes},
		},
		{
			name: "another pod forces cross-NUMA",
			devs: map[string][]*pluginapi.Device{res1: twoPerNode(), res2: twoPerNode()},
			holds: []hold{
				{"other", "c", res1, []string{"Dev1", "Dev4"}},
				{"other", "d", res2, []string{"Dev2", "Dev3"}},
			},
			pod:  newPod("pod", ctr("c1", res1, 2), ctr("c2", res2, 2)),
			want: map[string][]string{res1: crossForced, res2: crossForced},
		},
		{
			name: "devices held by the pod's containers",
			devs: map[string][]*pluginapi.Device{res1: twoPerNode()},
			holds: []hold{
				{"pod", "c1", res1, []string{"Dev1"}},
				{"pod", "c2", res1, []string{"Dev3"}},
			},
			pod: newPod("pod", ctr("c1", res1, 1), ctr("c2", res1, 1)),
			// Both held devices are on node 0; node 1's free devices do not count.
			want: map[string][]string{res1: {"{01 true}", "{11 false}"}},
		},
		{
			name: "more requested than available",
			devs: map[string][]*pluginapi.Device{res1: onePerNode()},
			pod:  newPod("pod", ctr("c1", res1, 1), ctr("c2", res1, 2)),
			want: map[string][]string{res1: nothingFits},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.setUp(t)
			got := h.m.GetPodTopologyHints(tc.pod)
			assert.Equal(t, tc.want, allHintStrings(got))
			for res, want := range tc.want {
				assert.Equal(t, want == nil, got[res] == nil, res)
			}
		})
	}
}

// Mirrors TestGetTopologyHintsWithUpdates: hints are asked again and again,
// at container and pod scope, while the plugin pushes device updates. The
// race detector must stay quiet, and every answer must be the one the
// devices allow at any moment: all on node 0, so exactly {0} preferred.
func TestTopologyHintsDuringDeviceUpdates(t *testing.T) {
	const n = 1000
	list := func(unhealthyEvery int, extra int) []*pluginapi.Device {
		devs := make([]*pluginapi.Device, 0, n+extra)
		for i := range n + extra {
			health := healthy
			if unhealthyEvery > 0 && i%unhealthyEvery == 1 {
				health = sick
			}
			devs = append(devs, dev(fmt.Sprintf("dev%d", i), health, 0))
		}
		return devs
	}
	h := newHarness(t, func(o *Options) { o.NUMANodes = []int{0} }).start()
	p := h.registered(res1, list(0, 0))
	pod := newPod("pod", ctr("c", res1, 1))
	h.pods.add(pod)

	pushed := make(chan struct{})
	go func() {
		defer close(pushed)
		for i := range 10 {
			p.Update(list(i+2, 0))
		}
		p.Update(list(0, 1)) // the last: one more device
	}()
	want := map[string][]string{res1: {"{01 true}"}}
	deadline := time.Now().Add(waitTimeout)
	for {
		assert.Equal(t, want, allHintStrings(h.m.GetTopologyHints(pod, &pod.Spec.Containers[0])))
		assert.Equal(t, want, allHintStrings(h.m.GetPodTopologyHints(pod)))
		if c, _ := h.capacity(res1); c == n+1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the last update never arrived")
	}
	<-pushed
	require.Equal(t, []string{"{01 true}"}, hintStrings(h.m.GetTopologyHints(pod, &pod.Spec.Containers[0])[res1]))
}

// numaHistogram counts the devices of ids per NUMA node of the devices in
// devs (devices without a node are not counted).
func numaHistogram(devs []*pluginapi.Device, ids []string) map[int64]int {
	byID := map[string]*pluginapi.Device{}
	for _, d := range devs {
		byID[d.GetID()] = d
	}
	out := map[int64]int{}
	for _, id := range ids {
		for _, n := range byID[id].GetTopology().GetNodes() {
			out[n.GetID()]++
		}
	}
	return out
}

// perNode returns count devices on each node, named prefix<node>-<i>.
func perNode(prefix string, count int, nodes ...int64) []*pluginapi.Device {
	var out []*pluginapi.Device
	for _, n := range nodes {
		for i := range count {
			out = append(out, dev(fmt.Sprintf("%s%d-%d", prefix, n, i), healthy, n))
		}
	}
	return out
}

// Mirrors TestTopologyAlignedAllocation, end to end: a plugin, an affinity
// store, Allocate. Devices come from the affinity's nodes first; the
// plugin's preference is followed among the candidates and IDs outside them
// are ignored.
func TestAllocationHonoursTopologyAffinity(t *testing.T) {
	twoNodes := perNode("n", 4, 0, 1)
	for _, tc := range []struct {
		name      string
		devs      []*pluginapi.Device
		affinity  []int
		request   int
		preferred []string // nil: the plugin offers no preference
		want      map[int64]int
		include   []string
		exclude   []string
	}{
		{name: "no topology: any device", devs: []*pluginapi.Device{dev("Dev1", healthy), dev("Dev2", healthy)},
			affinity: []int{0}, request: 1, want: map[int64]int{}},
		{name: "partial alignment", devs: []*pluginapi.Device{dev("Dev1", healthy, 0), dev("Dev2", healthy, 1)},
			affinity: []int{1}, request: 1, want: map[int64]int{1: 1}},
		{name: "node 0", devs: perNode("n", 2, 0, 1), affinity: []int{0}, request: 2, want: map[int64]int{0: 2}},
		{name: "node 1", devs: perNode("n", 2, 0, 1), affinity: []int{1}, request: 2, want: map[int64]int{1: 2}},
		{name: "unsatisfiable on the hinted node", devs: perNode("n", 3, 0, 1), affinity: []int{0}, request: 4,
			want: map[int64]int{0: 3, 1: 1}},
		{name: "two of four nodes", devs: perNode("n", 2, 0, 1, 2, 3), affinity: []int{1, 3}, request: 4,
			want: map[int64]int{1: 2, 3: 2}},
		{name: "preferred aligned devices taken", devs: twoNodes, affinity: []int{0}, request: 2,
			preferred: []string{"n0-2", "n0-3"}, want: map[int64]int{0: 2}, include: []string{"n0-2", "n0-3"}},
		{name: "preferred unaligned ignored, aligned kept", devs: twoNodes, affinity: []int{0}, request: 2,
			preferred: []string{"n1-0", "n0-3"}, want: map[int64]int{0: 2}, include: []string{"n0-3"}},
		{name: "bogus preferred IDs ignored", devs: twoNodes, affinity: []int{0}, request: 2,
			preferred: []string{"bogus", "n0-1"}, want: map[int64]int{0: 2}, include: []string{"n0-1"}, exclude: []string{"bogus"}},
		{name: "all aligned first, preferred fill the rest", devs: twoNodes, affinity: []int{0}, request: 6,
			preferred: []string{"n1-3", "n1-2", "bogus"}, want: map[int64]int{0: 4, 1: 2},
			include: []string{"n0-0", "n0-1", "n0-2", "n0-3", "n1-2", "n1-3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newAffinityStore()
			h := newHarness(t, func(o *Options) { o.AffinityStore = store; o.NUMANodes = []int{0, 1, 2, 3} }).start()
			p := h.registered(res1, tc.devs, withOptions(false, tc.preferred != nil))
			if tc.preferred != nil {
				p.SetPreferredAllocationFunc(func(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
					ids := append([]string(nil), req.GetContainerRequests()[0].GetMustIncludeDeviceIDs()...)
					ids = append(ids, tc.preferred...)
					return &pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{{DeviceIDs: ids}}}, nil
				})
			}
			store.set(t, "pod", "c", tc.affinity...)
			pod := newPod("pod", ctr("c", res1, tc.request))
			h.pods.add(pod)
			require.NoError(t, h.admit(pod))

			got := h.held(pod, "c", res1)
			assert.Len(t, got, tc.request)
			assert.Equal(t, tc.want, numaHistogram(tc.devs, got))
			assert.Subset(t, got, tc.include)
			for _, id := range tc.exclude {
				assert.NotContains(t, got, id)
			}
			if tc.preferred != nil {
				assert.NotEmpty(t, p.CallsOf(plugintest.MethodGetPreferredAllocation), "the plugin was asked")
			}
			assert.Equal(t, [][]string{got}, allocateRequests(t, p))
		})
	}
}

// Mirrors TestGetPreferredAllocationParameters: what the plugin is asked.
// Available is the candidates plus everything already picked, MustInclude
// is what was picked before asking (reused devices, then aligned ones), and
// Size is always the full request. Upstream lists mustInclude expectations
// without checking them (a test bug); we check them. IDs are sorted (the
// kubelet's are in map order).
func TestPreferredAllocationRequestParameters(t *testing.T) {
	// D0..D3 on node 0, D4..D7 on node 1.
	eight := []*pluginapi.Device{
		dev("D0", healthy, 0), dev("D1", healthy, 0), dev("D2", healthy, 0), dev("D3", healthy, 0),
		dev("D4", healthy, 1), dev("D5", healthy, 1), dev("D6", healthy, 1), dev("D7", healthy, 1),
	}
	for _, tc := range []struct {
		name     string
		devs     []*pluginapi.Device
		taken    []string // by another pod
		init     int      // devices of a regular init container (affinity node 0)
		affinity []int
		request  int
		want     preferredQuery
	}{
		{name: "fresh request", devs: devices("D", 4), request: 1,
			want: preferredQuery{[]string{"D0", "D1", "D2", "D3"}, nil, 1}},
		{name: "reused and aligned are must-include, all offered", devs: eight, init: 2, affinity: []int{0}, request: 5,
			want: preferredQuery{[]string{"D0", "D1", "D2", "D3", "D4", "D5", "D6", "D7"}, []string{"D0", "D1", "D2", "D3"}, 5}},
		{name: "more aligned than needed: only aligned offered", devs: eight, taken: []string{"D1", "D4"}, affinity: []int{0}, request: 2,
			want: preferredQuery{[]string{"D0", "D2", "D3"}, nil, 2}},
		{name: "reused plus aligned choice", devs: eight, taken: []string{"D1", "D4"}, init: 1, affinity: []int{0}, request: 2,
			want: preferredQuery{[]string{"D0", "D2", "D3"}, []string{"D0"}, 2}},
		{name: "multi-socket", devs: perNode("n", 2, 0, 1, 2, 3), affinity: []int{1, 3}, request: 6,
			want: preferredQuery{
				[]string{"n0-0", "n0-1", "n1-0", "n1-1", "n2-0", "n2-1", "n3-0", "n3-1"},
				[]string{"n1-0", "n1-1", "n3-0", "n3-1"}, 6,
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newAffinityStore()
			h := newHarness(t, func(o *Options) { o.AffinityStore = store; o.NUMANodes = []int{0, 1, 2, 3} }).start()
			p := h.registered(res1, tc.devs, withOptions(false, true))
			if len(tc.taken) > 0 {
				h.give(p, newPod("other", ctr("c", res1, len(tc.taken))), "c", tc.taken...)
			}
			pod := newPod("pod", ctr("app", res1, tc.request))
			if tc.init > 0 {
				pod.Spec.InitContainers = []v1.Container{ctr("init", res1, tc.init)}
				store.set(t, "pod", "init", 0)
			}
			store.set(t, "pod", "app", tc.affinity...)
			h.pods.add(pod)
			for i := range pod.Spec.InitContainers {
				require.NoError(t, h.m.Allocate(context.Background(), pod, &pod.Spec.InitContainers[i]))
			}
			asked := len(p.CallsOf(plugintest.MethodGetPreferredAllocation))
			require.NoError(t, h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]))

			require.Len(t, p.CallsOf(plugintest.MethodGetPreferredAllocation), asked+1, "asked once for the app container")
			q := lastPreferredQuery(t, p)
			assert.Equal(t, tc.want.available, q.available, "available")
			assert.Equal(t, tc.want.mustInclude, q.mustInclude, "must include")
			assert.Equal(t, tc.want.size, q.size, "size")
			held := h.held(pod, "app", res1)
			assert.Len(t, held, tc.request)
			assert.Subset(t, held, tc.want.mustInclude)
		})
	}
}
