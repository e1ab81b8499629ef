package devicemanager

// Allocation tests of the kubelet's devicemanager manager_test.go, rewritten
// against the public surface; see upstream_test.go. The NUMA-aligned
// allocation tests of topology_hints_test.go are in upstream_hints_test.go.

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/topology"
)

// affinityStore is a topology.AffinityStore the test fills in.
type affinityStore struct {
	mu    sync.Mutex
	hints map[string]topology.Hint
}

func newAffinityStore() *affinityStore { return &affinityStore{hints: map[string]topology.Hint{}} }

func (s *affinityStore) GetAffinity(podUID, containerName string) topology.Hint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hints[podUID+"/"+containerName]
}

// set gives the container an affinity to nodes (none: no preference).
func (s *affinityStore) set(t *testing.T, podUID, containerName string, nodes ...int) {
	t.Helper()
	h := topology.Hint{Preferred: true}
	if len(nodes) > 0 {
		m, err := topology.NewBitMask(nodes...)
		require.NoError(t, err)
		h.NUMANodeAffinity = &m
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hints[podUID+"/"+containerName] = h
}

// give makes container of pod (added to the active pods) hold exactly ids of
// p's resource, through the plugin's preferred allocation. The plugin must
// offer GetPreferredAllocation and the container must have no affinity.
func (h *harness) give(p *plugintest.Plugin, pod *v1.Pod, container string, ids ...string) {
	h.t.Helper()
	p.SetPreferredAllocationFunc(func(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
		return &pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{{DeviceIDs: ids}}}, nil
	})
	defer p.SetPreferredAllocationFunc(nil)
	c := ctr(container, p.ResourceName(), len(ids))
	h.pods.add(pod)
	require.NoError(h.t, h.m.Allocate(context.Background(), pod, &c))
	require.ElementsMatch(h.t, ids, h.held(pod, container, p.ResourceName()))
}

// preferredQuery is one recorded GetPreferredAllocation container request.
type preferredQuery struct {
	available, mustInclude []string
	size                   int32
}

func lastPreferredQuery(t *testing.T, p *plugintest.Plugin) preferredQuery {
	t.Helper()
	calls := p.CallsOf(plugintest.MethodGetPreferredAllocation)
	require.NotEmpty(t, calls)
	req, ok := calls[len(calls)-1].Request.(*pluginapi.PreferredAllocationRequest)
	require.True(t, ok)
	require.Len(t, req.GetContainerRequests(), 1)
	cr := req.GetContainerRequests()[0]
	return preferredQuery{cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), cr.GetAllocationSize()}
}

func allocateRequests(t *testing.T, p *plugintest.Plugin) [][]string {
	t.Helper()
	var out [][]string
	for _, c := range p.CallsOf(plugintest.MethodAllocate) {
		req, ok := c.Request.(*pluginapi.AllocateRequest)
		require.True(t, ok)
		require.Len(t, req.GetContainerRequests(), 1)
		out = append(out, req.GetContainerRequests()[0].GetDevicesIds())
	}
	return out
}

func (h *harness) runOptions(pod *v1.Pod, container int) *DeviceRunContainerOptions {
	h.t.Helper()
	opts, err := h.m.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[container])
	require.NoError(h.t, err)
	return opts
}

// Mirrors TestFilterByAffinity: with an affinity to node 2, dev2 (nodes 1
// and 2), dev3 and dev4 (node 2) are aligned, dev1 (node 1) is not. Upstream
// calls filterByAffinity; here the tiers show in what Allocate takes and in
// what it asks the plugin. Our requests list IDs sorted (the kubelet's are in map order).
func TestAllocationTiersFollowAffinity(t *testing.T) {
	all := []*pluginapi.Device{
		dev("dev1", healthy, 1), dev("dev2", healthy, 1, 2), dev("dev3", healthy, 2), dev("dev4", healthy, 2), dev("dev5", healthy),
	}
	for _, tc := range []struct {
		name      string
		taken     []string // by another pod first
		request   int
		preferred []string        // the plugin's answer; nil: its default
		query     *preferredQuery // nil: the plugin is not asked
		within    []string        // the devices must come from these
	}{
		{
			name: "the one aligned device covers the request", taken: []string{"dev3", "dev4", "dev5"},
			request: 1, within: []string{"dev2"},
		},
		{
			name: "aligned device first, then the plugin chooses", taken: []string{"dev3", "dev4", "dev5"},
			request: 2, query: &preferredQuery{[]string{"dev1", "dev2"}, []string{"dev2"}, 2},
			within: []string{"dev1", "dev2"},
		},
		{
			name: "the plugin chooses among the aligned only", taken: []string{"dev5"},
			request: 1, preferred: []string{"dev1"},
			query:  &preferredQuery{[]string{"dev2", "dev3", "dev4"}, nil, 1},
			within: []string{"dev2", "dev3", "dev4"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newAffinityStore()
			h := newHarness(t, func(o *Options) { o.AffinityStore = store; o.NUMANodes = []int{0, 1, 2} }).start()
			p := h.registered(res1, all, withOptions(false, true))
			h.give(p, newPod("other", ctr("c", res1, len(tc.taken))), "c", tc.taken...)
			asked := len(p.CallsOf(plugintest.MethodGetPreferredAllocation))

			store.set(t, "pod", "c", 2)
			if tc.preferred != nil {
				p.SetPreferredAllocationFunc(func(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
					return &pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{{DeviceIDs: tc.preferred}}}, nil
				})
			}
			pod := newPod("pod", ctr("c", res1, tc.request))
			h.pods.add(pod)
			require.NoError(t, h.admit(pod))

			got := h.held(pod, "c", res1)
			assert.Len(t, got, tc.request)
			assert.Subset(t, tc.within, got)
			if tc.query == nil {
				assert.Len(t, p.CallsOf(plugintest.MethodGetPreferredAllocation), asked, "plugin not asked")
				return
			}
			require.Len(t, p.CallsOf(plugintest.MethodGetPreferredAllocation), asked+1)
			q := lastPreferredQuery(t, p)
			assert.Equal(t, tc.query.available, q.available)
			assert.Equal(t, tc.query.mustInclude, q.mustInclude)
			assert.Equal(t, tc.query.size, q.size)
		})
	}
}

// fixedResponse returns an Allocate hook answering the same for any devices,
// plus perDevice for each device.
func fixedResponse(base func() *pluginapi.ContainerAllocateResponse,
	perDevice func(id string, r *pluginapi.ContainerAllocateResponse)) plugintest.AllocateFunc {
	return func(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		resp := &pluginapi.AllocateResponse{}
		for _, cr := range req.GetContainerRequests() {
			r := base()
			for _, id := range cr.GetDevicesIds() {
				perDevice(id, r)
			}
			resp.ContainerResponses = append(resp.ContainerResponses, r)
		}
		return resp, nil
	}
}

// Mirrors TestPodContainerDeviceAllocation: containers asking for two
// resources (one topology-aware) get merged run options; a request that
// cannot be met fails with the kubelet's exact text and leaves nothing
// behind; allocated counts follow.
func TestAllocateContainersAcrossResources(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.NUMANodes = []int{0} }).start()
	p1 := h.registered(res1, []*pluginapi.Device{dev("dev1", healthy, 0), dev("dev2", healthy, 0)})
	p1.SetAllocateFunc(fixedResponse(func() *pluginapi.ContainerAllocateResponse {
		return &pluginapi.ContainerAllocateResponse{
			Envs:    map[string]string{"key1": "val1"},
			Devices: []*pluginapi.DeviceSpec{{ContainerPath: "/dev/r1ctl", HostPath: "/dev/r1ctl", Permissions: "mrw"}},
			Mounts: []*pluginapi.Mount{
				{ContainerPath: "/usr/lib/r1", HostPath: "/opt/r1/lib", ReadOnly: true},
				{ContainerPath: "/usr/bin/r1", HostPath: "/opt/r1/bin", ReadOnly: true},
			},
		}
	}, func(id string, r *pluginapi.ContainerAllocateResponse) {
		r.Devices = append(r.Devices, &pluginapi.DeviceSpec{ContainerPath: "/dev/" + id, HostPath: "/dev/" + id, Permissions: "mrw"})
	}))
	p2 := h.registered(res2, []*pluginapi.Device{dev("dev3", healthy), dev("dev4", healthy)})
	envOf := map[string]string{"dev3": "val2", "dev4": "val3"}
	p2.SetAllocateFunc(fixedResponse(func() *pluginapi.ContainerAllocateResponse {
		return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	}, func(id string, r *pluginapi.ContainerAllocateResponse) { r.Envs["key2"] = envOf[id] }))

	podA := newPod("podA", ctr("c", res1, 2, "cpu", 1, res2, 1))
	h.pods.add(podA)
	require.NoError(t, h.admit(podA))
	opts := h.runOptions(podA, 0)
	require.NotNil(t, opts)
	assert.Len(t, opts.Devices, 3)
	assert.Len(t, opts.Mounts, 2)
	assert.ElementsMatch(t, []EnvVar{{Name: "key1", Value: "val1"}, {Name: "key2", Value: "val2"}}, opts.Envs)
	assert.Equal(t, v1.ResourceList{res1: quantity(2), res2: quantity(1)}, h.m.UpdatePluginResources(v1.ResourceList{}, podA))
	assert.Equal(t, [][]string{{"dev1", "dev2"}}, allocateRequests(t, p1), "device IDs sent sorted")
	view := h.m.GetDevices("podA", "c")
	require.Len(t, view, 2, "cpu is not a device-plugin resource")
	for _, id := range []string{"dev1", "dev2"} {
		require.NotNil(t, view[res1][id].GetTopology(), id)
		assert.Equal(t, int64(0), view[res1][id].GetTopology().GetNodes()[0].GetID(), id)
	}
	assert.Nil(t, view[res2]["dev3"].GetTopology())

	podB := newPod("podB", ctr("c", res1, 1))
	err := h.admit(podB)
	require.ErrorIs(t, err, ErrInsufficientDevices)
	assert.EqualError(t, err, "requested number of devices unavailable for domain1.com/resource1. Requested: 1, Available: 0")
	assert.Nil(t, h.runOptions(podB, 0), "inactive pod without records: no options")
	h.pods.add(podB)
	opts, err = h.m.GetDeviceRunContainerOptions(context.Background(), podB, &podB.Spec.Containers[0])
	assert.ErrorIs(t, err, ErrInsufficientDevices, "an active pod's missing record is allocated again, and fails again")
	assert.Nil(t, opts)
	assert.Len(t, allocateRequests(t, p1), 1)

	podC := newPod("podC", ctr("c", res2, 1))
	h.pods.add(podC)
	require.NoError(t, h.admit(podC))
	opts = h.runOptions(podC, 0)
	require.NotNil(t, opts)
	assert.Empty(t, opts.Devices)
	assert.Empty(t, opts.Mounts)
	assert.Equal(t, []EnvVar{{Name: "key2", Value: "val3"}}, opts.Envs)
	assert.Equal(t, v1.ResourceList{res1: quantity(2), res2: quantity(2)}, h.m.UpdatePluginResources(v1.ResourceList{}, podC))
}

// Mirrors TestPodContainerDeviceToAllocate: the refusals before any device
// is picked, each with the kubelet's text (and our sentinel), no plugin call
// and no record.
func TestAllocateRefusalsKeepKubeletText(t *testing.T) {
	t.Run("registered without healthy devices", func(t *testing.T) {
		h := newHarness(t).start()
		p := h.registered(res1, []*pluginapi.Device{dev("dev1", sick), dev("dev2", sick)})
		for _, n := range []int{1, 0} { // even a zero request is refused
			pod := newPod(fmt.Sprintf("pod%d", n), ctr("c", res1, n))
			err := h.admit(pod)
			require.ErrorIs(t, err, ErrNoHealthyDevices, n)
			assert.EqualError(t, err, "no healthy devices present; cannot allocate unhealthy devices domain1.com/resource1")
			assert.Nil(t, h.m.GetDevices(string(pod.UID), "c"))
		}
		assert.Empty(t, p.CallsOf(plugintest.MethodAllocate))
	})
	t.Run("unregistered resource that only a plugin serves", func(t *testing.T) {
		h := newHarness(t, func(o *Options) { o.RequirePlugin = []string{"domain2.com/*"} }).start()
		err := h.admit(newPod("pod", ctr("c", res2, 1)))
		require.ErrorIs(t, err, ErrUnregisteredResource)
		assert.EqualError(t, err, "cannot allocate unregistered device domain2.com/resource2")
		assert.Nil(t, h.m.GetDevices("pod", "c"))
	})
	t.Run("unregistered resource that still holds allocations", func(t *testing.T) {
		h := newHarness(t).start()
		p := h.registered(res2, devices("dev", 2))
		holder := newPod("holder", ctr("c", res2, 1))
		h.pods.add(holder)
		require.NoError(t, h.admit(holder))
		p.Stop()
		h.stepUntilRemoved(res2)

		err := h.admit(newPod("pod", ctr("c", res2, 1)))
		require.ErrorIs(t, err, ErrUnregisteredResource)
		assert.EqualError(t, err, "cannot allocate unregistered device domain2.com/resource2")
		assert.Nil(t, h.m.GetDevices("pod", "c"))
	})
	t.Run("previously allocated device no longer healthy", func(t *testing.T) {
		h := newHarness(t).start()
		p := h.registered(res3, []*pluginapi.Device{dev("dev5", healthy), dev("dev7", healthy), dev("dev8", healthy)})
		pod := newPod("pod", ctr("c", res3, 1))
		h.pods.add(pod)
		require.NoError(t, h.admit(pod))
		require.Equal(t, []string{"dev5"}, h.held(pod, "c", res3))

		p.Update([]*pluginapi.Device{dev("dev5", sick), dev("dev7", healthy), dev("dev8", healthy)})
		h.waitCapacity(res3, 3, 2)
		err := h.admit(pod)
		require.ErrorIs(t, err, ErrAllocatedDeviceUnhealthy)
		assert.EqualError(t, err, "previously allocated devices are no longer healthy; cannot allocate unhealthy devices domain2.com/resource3")
		assert.Equal(t, []string{"dev5"}, h.held(pod, "c", res3), "the record stays")
		assert.Len(t, p.CallsOf(plugintest.MethodAllocate), 1)

		changed := newPod("pod", ctr("c", res3, 2))
		err = h.admit(changed)
		require.ErrorIs(t, err, ErrRequestChanged)
		assert.EqualError(t, err, `pod "pod" container "c" changed request for resource "domain2.com/resource3" from 1 to 2`)
	})
	// A container's admission is all or nothing. Resources are
	// handled in name order, so res1 is allocated (plugin call made) before
	// res3 is refused; res1's devices must be free again afterwards.
	t.Run("a later refusal releases the earlier resources", func(t *testing.T) {
		h := newHarness(t).start()
		p := h.registered(res1, devices("dev", 1))
		h.registered(res3, []*pluginapi.Device{dev("x", sick)})
		pod := newPod("pod", ctr("c", res1, 1, res3, 1))
		h.pods.add(pod)
		err := h.admit(pod)
		require.ErrorIs(t, err, ErrNoHealthyDevices)
		assert.EqualError(t, err, "no healthy devices present; cannot allocate unhealthy devices "+res3)
		assert.Len(t, p.CallsOf(plugintest.MethodAllocate), 1, "res1 was allocated first")
		assert.Nil(t, h.m.GetDevices("pod", "c"))
		assert.Empty(t, h.m.UpdatePluginResources(v1.ResourceList{}, pod))

		next := newPod("next", ctr("c", res1, 1))
		h.pods.add(next)
		require.NoError(t, h.admit(next))
		assert.Equal(t, []string{"dev0"}, h.held(next, "c", res1))
	})
}

// Mirrors TestDevicesToAllocateConflictWithUpdateAllocatedDevices: while the
// plugin thinks about its preferred allocation (manager lock released),
// garbage collection removes the only other pod holding the resource; the
// allocation still succeeds with the plugin's choice.
func TestAllocateSurvivesGCDuringPreferredAllocation(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 2), withOptions(false, true))
	old := newPod("old", ctr("c", res1, 1))
	h.pods.add(old)
	require.NoError(t, h.admit(old))
	require.Equal(t, []string{"dev0"}, h.held(old, "c", res1))

	release := p.Block(plugintest.MethodGetPreferredAllocation)
	defer release()
	pod := newPod("pod", ctr("c", res1, 1))
	h.pods.add(pod)
	done := make(chan error, 1)
	go func() { done <- h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]) }()
	_, err := p.WaitForCalls(waitCtx(t), plugintest.MethodGetPreferredAllocation, 2)
	require.NoError(t, err)
	assert.Equal(t, []string{"dev1"}, lastPreferredQuery(t, p).available)

	h.pods.remove(old.UID)
	h.m.UpdateAllocatedDevices()
	assert.Nil(t, h.m.GetDevices("old", "c"), "collected while the allocation is in flight")
	release()
	require.NoError(t, <-done)
	assert.Equal(t, []string{"dev1"}, h.held(pod, "c", res1))
}

// Mirrors the same upstream test for the Allocate call itself. Unlike the
// kubelet (PR #137534): the devices a pending allocation picked stay reserved
// through a garbage collection, even for a pod that is not (yet) active, so
// a second pod cannot be given the same device (upstream PR #137534).
func TestPendingReservationSurvivesGC(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 2))
	release := p.Block(plugintest.MethodAllocate)
	defer release()

	first := newPod("first", ctr("c", res1, 1)) // never in the active pods
	done := make(chan error, 2)
	go func() { done <- h.m.Allocate(context.Background(), first, &first.Spec.Containers[0]) }()
	_, err := p.WaitForCalls(waitCtx(t), plugintest.MethodAllocate, 1)
	require.NoError(t, err)
	h.m.UpdateAllocatedDevices()

	second := newPod("second", ctr("c", res1, 1))
	h.pods.add(second)
	go func() { done <- h.m.Allocate(context.Background(), second, &second.Spec.Containers[0]) }()
	_, err = p.WaitForCalls(waitCtx(t), plugintest.MethodAllocate, 2)
	require.NoError(t, err)
	reqs := allocateRequests(t, p)
	assert.NotEqual(t, reqs[0], reqs[1], "the second pod got another device")

	release()
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	assert.Equal(t, reqs[1], h.held(second, "c", res1))
	assert.Equal(t, reqs[0], h.held(first, "c", res1), "the reservation became a record")
}

// Mirrors TestGetDeviceRunContainerOptions: a container's options merge the
// answers for its resources; once its pod is no longer active and garbage
// collection ran, there are no options and no error.
func TestRunOptionsMergedAndDroppedWithPod(t *testing.T) {
	h := newHarness(t).start()
	p1 := h.registered(res1, devices("a", 3))
	h.registered(res2, devices("b", 2))
	pod1 := newPod("pod1", ctr("c", res1, 2, res2, 1))
	pod2 := newPod("pod2", ctr("c", res2, 1))
	h.pods.add(pod1, pod2)
	require.NoError(t, h.admit(pod1))
	require.NoError(t, h.admit(pod2))

	opts := h.runOptions(pod1, 0)
	require.NotNil(t, opts)
	assert.Len(t, opts.Devices, 3)
	assert.ElementsMatch(t, []EnvVar{
		{Name: "PLUGINTEST_DOMAIN1_COM_RESOURCE1", Value: "a0,a1"},
		{Name: "PLUGINTEST_DOMAIN2_COM_RESOURCE2", Value: "b0"},
	}, opts.Envs)
	assert.ElementsMatch(t, []Annotation{
		{Name: "plugintest/domain1.com_resource1", Value: "a0,a1"},
		{Name: "plugintest/domain2.com_resource2", Value: "b0"},
	}, opts.Annotations)
	assert.Contains(t, opts.Mounts, Mount{
		Name: "/run/plugintest/domain1.com_resource1/a0", ContainerPath: "/run/plugintest/domain1.com_resource1/a0",
		HostPath: "/host/run/plugintest/domain1.com_resource1/a0", ReadOnly: true,
	}, "a mount is named after its container path")
	assert.Contains(t, opts.Devices, DeviceInfo{
		PathOnHost: "/host/dev/plugintest/domain2.com_resource2/b0", PathInContainer: "/dev/plugintest/domain2.com_resource2/b0", Permissions: "rw",
	})

	// Until the pod sources are ready, garbage collection does nothing.
	h.pods.remove(pod1.UID)
	h.ready.set(false)
	h.m.UpdateAllocatedDevices()
	require.NotNil(t, h.runOptions(pod1, 0), "GC is inert while sources are not ready")
	h.ready.set(true)
	h.m.UpdateAllocatedDevices()
	opts, err := h.m.GetDeviceRunContainerOptions(context.Background(), pod1, &pod1.Spec.Containers[0])
	require.NoError(t, err)
	assert.Nil(t, opts)
	assert.Len(t, p1.CallsOf(plugintest.MethodAllocate), 1, "an inactive pod is not allocated again")
	opts = h.runOptions(pod2, 0)
	require.NotNil(t, opts)
	assert.Len(t, opts.Devices, 1)
}

func restartable() *v1.ContainerRestartPolicy {
	always := v1.ContainerRestartPolicyAlways
	return &always
}

// Mirrors TestInitContainerDeviceAllocation: app containers take devices the
// init containers used; the two app containers get different ones.
func TestInitContainersShareDevicesWithAppContainers(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("r1-", 4))
	h.registered(res2, devices("r2-", 4))
	pod := newPod("pod", ctr("app1", res1, 1, res2, 1), ctr("app2", res1, 1, res2, 1))
	pod.Spec.InitContainers = []v1.Container{ctr("init1", res1, 1), ctr("init2", res1, 2)}
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))

	init1 := sets.New(h.held(pod, "init1", res1)...)
	init2 := sets.New(h.held(pod, "init2", res1)...)
	app1 := sets.New(h.held(pod, "app1", res1)...)
	app2 := sets.New(h.held(pod, "app2", res1)...)
	assert.Equal(t, 1, init1.Len())
	assert.Equal(t, 2, init2.Len())
	assert.Equal(t, 1, app1.Len())
	assert.Equal(t, 1, app2.Len())
	assert.True(t, init2.IsSuperset(init1), "init2 %v reuses init1 %v", init2, init1)
	assert.True(t, init2.IsSuperset(app1), "app1 %v reuses init2 %v", app1, init2)
	assert.True(t, init2.IsSuperset(app2), "app2 %v reuses init2 %v", app2, init2)
	assert.False(t, app1.HasAny(app2.UnsortedList()...), "apps do not share")
	assert.Len(t, h.held(pod, "app1", res2), 1)
	assert.Len(t, h.held(pod, "app2", res2), 1)
	assert.NotEqual(t, h.held(pod, "app1", res2), h.held(pod, "app2", res2))
}

// Mirrors TestRestartableInitContainerDeviceAllocation: sidecars may take
// devices of a regular init container that ran before them, but sidecars and
// app containers, which run together, never share.
func TestSidecarsGetDevicesOfTheirOwn(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("d", 6))
	pod := newPod("pod", ctr("app1", res1, 1), ctr("app2", res1, 2))
	pod.Spec.InitContainers = []v1.Container{ctr("init", res1, 3), ctr("sidecarA", res1, 1), ctr("sidecarB", res1, 2)}
	pod.Spec.InitContainers[1].RestartPolicy = restartable()
	pod.Spec.InitContainers[2].RestartPolicy = restartable()
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))

	held := map[string]sets.Set[string]{}
	for name, want := range map[string]int{"init": 3, "sidecarA": 1, "sidecarB": 2, "app1": 1, "app2": 2} {
		held[name] = sets.New(h.held(pod, name, res1)...)
		assert.Equal(t, want, held[name].Len(), name)
	}
	assert.True(t, held["init"].IsSuperset(held["sidecarA"]), "sidecarA reuses the init container's devices")
	assert.True(t, held["init"].IsSuperset(held["sidecarB"]), "sidecarB reuses the init container's devices")
	running := []string{"sidecarA", "sidecarB", "app1", "app2"}
	for i, a := range running {
		for _, b := range running[i+1:] {
			assert.False(t, held[a].HasAny(held[b].UnsortedList()...), "%s %v and %s %v share", a, held[a], b, held[b])
		}
	}
}

// Mirrors TestUpdatePluginResources: for a pod holding devices, allocatable
// is raised to the node-wide allocated count where it is missing or lower.
// Ours returns a new list and leaves the caller's alone.
func TestUpdatePluginResourcesRaisesAllocatable(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 1))
	h.registered(res2, devices("dev", 2))
	pod1 := newPod("pod1", ctr("c", res1, 1))
	pod2 := newPod("pod2", ctr("c", res2, 1))
	h.pods.add(pod1, pod2)
	require.NoError(t, h.admit(pod1))
	require.NoError(t, h.admit(pod2))

	node := v1.ResourceList{res2: quantity(2)}
	got := h.m.UpdatePluginResources(node, pod1)
	assert.Equal(t, v1.ResourceList{res1: quantity(1), res2: quantity(2)}, got)
	assert.Equal(t, v1.ResourceList{res2: quantity(2)}, node, "input not modified")

	assert.Equal(t, node, h.m.UpdatePluginResources(node, newPod("none")), "a pod without devices changes nothing")
	low := v1.ResourceList{res1: quantity(0), res2: quantity(0)}
	assert.Equal(t, v1.ResourceList{res1: quantity(1), res2: quantity(1)}, h.m.UpdatePluginResources(low, pod2))
}

// Mirrors TestDevicePreStartContainer: a plugin that asks for it gets
// PreStartContainer with exactly the container's devices before the options
// are handed out; a container asking for none of the resource causes no
// call. A failing PreStart fails with the kubelet's text.
func TestPreStartContainerGetsAllocatedDevices(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, []*pluginapi.Device{dev("dev2", healthy), dev("dev1", healthy)}, withOptions(true, false))
	pod := newPod("pod", ctr("c", res1, 2))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	require.Empty(t, p.CallsOf(plugintest.MethodPreStartContainer), "PreStart comes with the options, not Allocate")

	opts := h.runOptions(pod, 0)
	calls := p.CallsOf(plugintest.MethodPreStartContainer)
	require.Len(t, calls, 1)
	req, ok := calls[0].Request.(*pluginapi.PreStartContainerRequest)
	require.True(t, ok)
	assert.Equal(t, []string{"dev1", "dev2"}, req.GetDevicesIds())
	want := p.DefaultAllocate(&pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"dev1", "dev2"}}}}).ContainerResponses[0]
	require.NotNil(t, opts)
	assert.Len(t, opts.Devices, len(want.GetDevices()))
	assert.Len(t, opts.Mounts, len(want.GetMounts()))
	assert.Len(t, opts.Envs, len(want.GetEnvs()))

	none := newPod("none", ctr("c", res1, 0))
	h.pods.add(none)
	require.NoError(t, h.admit(none))
	opts, err := h.m.GetDeviceRunContainerOptions(context.Background(), none, &none.Spec.Containers[0])
	require.NoError(t, err)
	assert.Nil(t, opts)
	assert.Len(t, p.CallsOf(plugintest.MethodPreStartContainer), 1)

	p.SetError(plugintest.MethodPreStartContainer, fmt.Errorf("card on fire"))
	_, err = h.m.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
	require.ErrorIs(t, err, ErrPluginCall)
	assert.Contains(t, err.Error(), "device plugin PreStartContainer rpc failed with err: ")
	assert.Contains(t, err.Error(), "card on fire")
}

// Mirrors TestAdmitPodWithDRAResources: a resource the pod's
// ExtendedResourceClaimStatus maps to a DRA claim for that container is left
// to DRA (the gate is locked on in 1.37): Allocate skips it, while it still
// refuses the same request without the mapping or for another container.
func TestAllocateSkipsDRABackedResources(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.RequirePlugin = []string{res2} }).start()
	h.registered(res1, []*pluginapi.Device{dev("d0", sick)}) // would fail: nothing healthy
	p3 := h.registered(res3, devices("e", 1))
	mapping := func(container string, resources ...string) *v1.PodExtendedResourceClaimStatus {
		st := &v1.PodExtendedResourceClaimStatus{ResourceClaimName: "claim"}
		for i, r := range resources {
			st.RequestMappings = append(st.RequestMappings, v1.ContainerExtendedResourceRequest{
				ContainerName: container, ResourceName: r, RequestName: fmt.Sprintf("req-%d", i),
			})
		}
		return st
	}
	for _, tc := range []struct {
		name    string
		status  *v1.PodExtendedResourceClaimStatus
		wantErr error
	}{
		{"both resources mapped", mapping("c", res1, res2), nil},
		{"no mapping", nil, ErrNoHealthyDevices},
		{"mapped for another container", mapping("other", res1, res2), ErrNoHealthyDevices},
		{"only the registered one mapped", mapping("c", res1), ErrUnregisteredResource},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := newPod("pod-"+tc.name, ctr("c", res1, 1, res2, 1, res3, 1))
			pod.Status.ExtendedResourceClaimStatus = tc.status
			h.pods.add(pod)
			calls := len(p3.CallsOf(plugintest.MethodAllocate))
			err := h.admit(pod)
			if tc.wantErr != nil {
				assert.ErrorIs(t, err, tc.wantErr)
				assert.Nil(t, h.m.GetDevices(string(pod.UID), "c"), "nothing recorded")
				return
			}
			require.NoError(t, err)
			view := h.m.GetDevices(string(pod.UID), "c")
			assert.Equal(t, []string{res3}, sortedKeys(view), "only the plugin resource is allocated")
			assert.Len(t, p3.CallsOf(plugintest.MethodAllocate), calls+1)
			h.pods.remove(pod.UID)
			h.m.UpdateAllocatedDevices()
		})
	}
}
