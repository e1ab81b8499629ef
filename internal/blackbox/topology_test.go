package blackbox_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/topology"
)

type topologyHint = topology.Hint

func hintOf(preferred bool, nodes ...int) topology.Hint {
	bm, err := topology.NewBitMask(nodes...)
	if err != nil {
		panic(err)
	}
	return topology.Hint{NUMANodeAffinity: &bm, Preferred: preferred}
}

// hintStrings renders hints for comparison: "bits/P" or "bits/-".
func hintStrings(hs []topology.Hint) []string {
	out := make([]string, 0, len(hs))
	for _, h := range hs {
		s := "nil"
		if h.NUMANodeAffinity != nil {
			s = ""
			for i, b := range h.NUMANodeAffinity.GetBits() {
				if i > 0 {
					s += ","
				}
				s += string(rune('0' + b))
			}
		}
		if h.Preferred {
			s += "/P"
		} else {
			s += "/-"
		}
		out = append(out, s)
	}
	return out
}

func TestBitMask(t *testing.T) {
	empty, err := topology.NewBitMask()
	require.NoError(t, err)
	assert.Equal(t, 0, empty.Count())
	assert.Empty(t, empty.GetBits())
	assert.Equal(t, topology.BitMask(0), empty)

	m, err := topology.NewBitMask(63, 2, 0)
	require.NoError(t, err)
	assert.Equal(t, topology.BitMask(1|1<<2|1<<63), m)
	assert.Equal(t, []int{0, 2, 63}, m.GetBits())
	assert.Equal(t, 3, m.Count())
	for _, n := range []int{0, 2, 63} {
		assert.True(t, m.IsSet(n), "bit %d", n)
	}
	for _, n := range []int{1, 62, 64, -1, 1000} {
		assert.False(t, m.IsSet(n), "bit %d", n)
	}
	m, err = topology.NewBitMask(5, 1, 3, 1)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 3, 5}, m.GetBits())
	assert.Equal(t, 3, m.Count())

	for _, bad := range [][]int{{64}, {-1}, {0, 64}} {
		_, err := topology.NewBitMask(bad...)
		assert.Error(t, err, "%v", bad)
	}
	var h topology.Hint
	assert.Nil(t, h.NUMANodeAffinity)
}

func TestDiscover(t *testing.T) {
	root := tempDir(t)
	nodeDir := filepath.Join(root, "devices", "system", "node")
	for _, n := range []string{"node0", "node1", "node3", "node10", "power"} {
		require.NoError(t, os.MkdirAll(filepath.Join(nodeDir, n), 0o750))
	}
	for _, f := range []string{"online", "possible", "has_cpu", "has_memory"} {
		require.NoError(t, os.WriteFile(filepath.Join(nodeDir, f), []byte("0-1,3,10\n"), 0o600))
	}
	got, err := topology.Discover(root)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 3, 10}, got)
}

// Container-scope hints on a machine with NUMA nodes {0,1}: nil means no
// preference, an empty list that nothing fits; preferred hints are the
// narrowest that could hold the request.
func TestGetTopologyHints(t *testing.T) {
	numa := func(o *devicemanager.Options) { o.NUMANodes = []int{0, 1} }

	t.Run("no topology: nil", func(t *testing.T) {
		e := newEnv(t, numa)
		e.start(t)
		e.plugin(t, "p.sock", resGPU, nil, healthy("a"), dev("b", pluginapi.Healthy))
		p := pod("u1", ctr("c", resGPU, 1, "cpu", 1, "example.com/foo", 1))
		h := e.mgr.GetTopologyHints(p, &p.Spec.Containers[0])
		require.Contains(t, h, resGPU)
		assert.Nil(t, h[resGPU])
		assert.NotContains(t, h, "cpu")
		assert.NotContains(t, h, "example.com/foo")
	})
	t.Run("one device per node", func(t *testing.T) {
		e := newEnv(t, numa)
		e.start(t)
		e.plugin(t, "p.sock", resGPU, nil, healthy("Dev1", 0), healthy("Dev2", 1))
		for _, tc := range []struct {
			n    int
			want []string
		}{
			{1, []string{"0/P", "1/P", "0,1/-"}},
			{2, []string{"0,1/P"}},
			{3, []string{}},
		} {
			p := pod("u1", ctr("c", resGPU, tc.n))
			h := e.mgr.GetTopologyHints(p, &p.Spec.Containers[0])
			require.Contains(t, h, resGPU)
			require.NotNil(t, h[resGPU], "request %d: impossible must be empty, not nil", tc.n)
			assert.Equal(t, tc.want, hintStrings(h[resGPU]), "request %d", tc.n)
		}
		// Pod scope: two containers of one device each.
		p := pod("u2", ctr("a", resGPU, 1), ctr("b", resGPU, 1))
		assert.Equal(t, []string{"0,1/P"}, hintStrings(e.mgr.GetPodTopologyHints(p)[resGPU]))
		p.Spec.InitContainers = []v1.Container{ctr("i", resGPU, 1)}
		assert.Equal(t, []string{"0,1/P"}, hintStrings(e.mgr.GetPodTopologyHints(p)[resGPU]))
		p = pod("u3", ctr("a", resGPU, 2), ctr("b", resGPU, 1))
		h := e.mgr.GetPodTopologyHints(p)
		require.NotNil(t, h[resGPU])
		assert.Empty(t, h[resGPU])
		assert.Empty(t, e.mgr.GetPodTopologyHints(pod("u4", ctr("a", "cpu", 1))))
	})
	t.Run("only device-bearing nodes", func(t *testing.T) {
		e := newEnv(t, numa)
		e.start(t)
		e.plugin(t, "p.sock", resGPU, nil, healthy("Dev1"), healthy("Dev2", 1))
		p := pod("u1", ctr("c", resGPU, 1))
		assert.Equal(t, []string{"1/P"}, hintStrings(e.mgr.GetTopologyHints(p, &p.Spec.Containers[0])[resGPU]))
	})
	t.Run("devices used elsewhere", func(t *testing.T) {
		e := newEnv(t, numa)
		e.start(t)
		pl := e.plugin(t, "p.sock", resGPU, &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
			healthy("Dev1", 0), healthy("Dev2", 1), healthy("Dev3", 0), healthy("Dev4", 1))
		pl.setPreferred(func(context.Context, *pluginapi.ContainerPreferredAllocationRequest) ([]string, error) {
			return []string{"Dev1", "Dev2"}, nil
		})
		require.NoError(t, e.allocate(pod("other", ctr("c", resGPU, 2)), "c"))
		require.Equal(t, []string{"Dev1", "Dev2"}, ids(e.mgr, "other", "c", resGPU))
		p := pod("u1", ctr("c", resGPU, 2))
		e.pods.add(p)
		assert.Equal(t, []string{"0,1/-"}, hintStrings(e.mgr.GetTopologyHints(p, &p.Spec.Containers[0])[resGPU]))
	})
	t.Run("already allocated", func(t *testing.T) {
		e := newEnv(t, func(o *devicemanager.Options) {
			numa(o)
			o.AffinityStore = fixedAffinity{nodes: []int{0}}
		})
		e.start(t)
		e.plugin(t, "p.sock", resGPU, nil, healthy("a", 0), healthy("b", 0), healthy("c", 1))
		p := pod("u1", ctr("c", resGPU, 2))
		require.NoError(t, e.allocate(p, "c"))
		require.Equal(t, []string{"a", "b"}, ids(e.mgr, "u1", "c", resGPU))
		// Regenerated from exactly the held devices; node 1 bears a device of
		// the resource, so it is a candidate node too.
		assert.Equal(t, []string{"0/P", "0,1/-"}, hintStrings(e.mgr.GetTopologyHints(p, &p.Spec.Containers[0])[resGPU]))
		changed := pod("u1", ctr("c", resGPU, 3))
		h := e.mgr.GetTopologyHints(changed, &changed.Spec.Containers[0])
		require.NotNil(t, h[resGPU])
		assert.Empty(t, h[resGPU])
		fewer := pod("u1", ctr("c", resGPU, 1))
		h = e.mgr.GetTopologyHints(fewer, &fewer.Spec.Containers[0])
		require.NotNil(t, h[resGPU])
		assert.Empty(t, h[resGPU])
	})
}

// Without Options.NUMANodes the machine has no topology: no preference.
func TestHintsWithoutMachineTopology(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("a", 0), healthy("b", 1))
	p := pod("u1", ctr("c", resGPU, 1))
	h := e.mgr.GetTopologyHints(p, &p.Spec.Containers[0])
	require.Contains(t, h, resGPU)
	assert.Nil(t, h[resGPU])
	h = e.mgr.GetPodTopologyHints(p)
	require.Contains(t, h, resGPU)
	assert.Nil(t, h[resGPU])
}

// NUMA nodes the machine does not know are dropped from the hints.
func TestHintsDropUnknownNUMANodes(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.NUMANodes = []int{0, 1} })
	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("a", 0), healthy("b", 5))
	p := pod("u1", ctr("c", resGPU, 1))
	assert.Equal(t, []string{"0/P"}, hintStrings(e.mgr.GetTopologyHints(p, &p.Spec.Containers[0])[resGPU]))
	p2 := pod("u2", ctr("c", resGPU, 2))
	h := e.mgr.GetTopologyHints(p2, &p2.Spec.Containers[0])
	require.NotNil(t, h[resGPU])
	assert.Empty(t, h[resGPU])
}

// Hints account for the devices the container can reuse from the pod's
// init containers.
func TestTopologyHintsWithReusableDevices(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.NUMANodes = []int{0, 1, 2, 3} })
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
		healthy("a", 0), healthy("b", 1))
	pl.setPreferred(func(context.Context, *pluginapi.ContainerPreferredAllocationRequest) ([]string, error) {
		return []string{"a"}, nil
	})
	p := pod("u1", ctr("app1", resGPU, 1), ctr("app2", resGPU, 2))
	p.Spec.InitContainers = []v1.Container{ctr("init", resGPU, 1)}
	require.NoError(t, e.allocate(p, "init"))
	require.Equal(t, []string{"a"}, ids(e.mgr, "u1", "init", resGPU))
	assert.Equal(t, []string{"0/P", "0,1/-"}, hintStrings(e.mgr.GetTopologyHints(p, findContainer(p, "app1"))[resGPU]))
	assert.Equal(t, []string{"0,1/P"}, hintStrings(e.mgr.GetTopologyHints(p, findContainer(p, "app2"))[resGPU]))
}

// A recorded device missing from the device list counts as "no topology"
// (the kubelet dereferences a nil device there).
func TestMissingDevicesCountAsNoTopology(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.NUMANodes = []int{0, 1} })
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("a", 0), healthy("b", 1))
	p := pod("u1", ctr("app", resGPU, 1))
	p.Spec.InitContainers = []v1.Container{ctr("init", resGPU, 2)}
	require.NoError(t, e.allocate(p, "init"))
	pl.update(healthy("c", 0), healthy("d", 1))
	e.waitAllocatable(t, resGPU, "c", "d")
	h := e.mgr.GetTopologyHints(p, findContainer(p, "init"))
	require.NotNil(t, h[resGPU])
	assert.Empty(t, h[resGPU])
	// app: reusable a,b (missing → no topology, not counted), available c,d.
	h = e.mgr.GetTopologyHints(p, findContainer(p, "app"))
	assert.Equal(t, []string{"0/P", "1/P", "0,1/-"}, hintStrings(h[resGPU]))
	_ = e.mgr.GetPodTopologyHints(p)
	st := &v1.PodStatus{InitContainerStatuses: []v1.ContainerStatus{{Name: "init"}}, ContainerStatuses: []v1.ContainerStatus{{Name: "app"}}}
	e.mgr.UpdateAllocatedResourcesStatus(p, st)
}

// Pod scope: a pod that already holds devices gets the hints of exactly
// those; a request that no longer matches them gets [].
func TestPodHintsRegeneratedFromHeldDevices(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) {
		o.NUMANodes = []int{0, 1}
		o.AffinityStore = fixedAffinity{nodes: []int{1}}
	})
	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("a", 0), healthy("b", 1), healthy("c", 1))
	p := pod("u1", ctr("x", resGPU, 1), ctr("y", resGPU, 1))
	require.NoError(t, e.allocate(p, "x"))
	require.NoError(t, e.allocate(p, "y"))
	require.Equal(t, []string{"b", "c"}, sortedCopy(append(ids(e.mgr, "u1", "x", resGPU), ids(e.mgr, "u1", "y", resGPU)...)), "aligned picks")
	assert.Equal(t, []string{"1/P", "0,1/-"}, hintStrings(e.mgr.GetPodTopologyHints(p)[resGPU]))
	bigger := pod("u1", ctr("x", resGPU, 1), ctr("y", resGPU, 2))
	h := e.mgr.GetPodTopologyHints(bigger)
	require.NotNil(t, h[resGPU])
	assert.Empty(t, h[resGPU])
}
