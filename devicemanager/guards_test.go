package devicemanager

// The tests in this file came from a mutation sweep of the package: each
// fails when one guard or state update it names is changed, where no other
// test did.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/endpoint"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podstate"
)

// faultyStore wraps the real store: CreateCheckpoint fails (after writing when
// writeThenFail) while failWrites is set; ListCheckpoints fails with listErr.
type faultyStore struct {
	checkpoint.Manager
	mu                        sync.Mutex
	failWrites, writeThenFail bool
	listErr                   error
}

func (s *faultyStore) CreateCheckpoint(key string, cp checkpoint.Checkpoint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.failWrites {
		return s.Manager.CreateCheckpoint(key, cp)
	}
	if s.writeThenFail {
		_ = s.Manager.CreateCheckpoint(key, cp)
	}
	return errors.New("injected write failure")
}

func (s *faultyStore) ListCheckpoints() ([]string, error) {
	if s.listErr != nil {
		return nil, s.listErr
	}
	return s.Manager.ListCheckpoints()
}

func (s *faultyStore) set(fail, writeThenFail bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failWrites, s.writeThenFail = fail, writeThenFail
}

func (h *harness) faultyStore() *faultyStore {
	h.m.writeMu.Lock() // no write in progress
	defer h.m.writeMu.Unlock()
	s := &faultyStore{Manager: h.m.store}
	h.m.store = s
	return s
}

// TestReusePoolDroppedWhenAnotherPodIsAdmitted: SPEC §3.1 step 1: admitting a pod drops every other pod's reuse pool.
func TestReusePoolDroppedWhenAnotherPodIsAdmitted(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 4))
	a := newPod("a", ctr("app", res1, 1))
	a.Spec.InitContainers = []v1.Container{ctr("init", res1, 1)}
	b := newPod("b", ctr("app", res1, 1))
	h.pods.add(a, b)
	ctx := context.Background()
	require.NoError(t, h.m.Allocate(ctx, a, &a.Spec.InitContainers[0]))
	require.NoError(t, h.admit(b))
	require.NoError(t, h.m.Allocate(ctx, a, &a.Spec.Containers[0]))
	assert.NotEqual(t, h.held(a, "init", res1), h.held(a, "app", res1), "a's pool was dropped when b was admitted")
}

// TestRequirePluginFailureReleasesEarlierResources: Allocate doc: "when one resource fails, what this call reserved ... is released".
func TestRequirePluginFailureReleasesEarlierResources(t *testing.T) {
	const required = "zzz.example.com/gpu" // sorts after res1, never registered
	h := newHarness(t, func(o *Options) { o.RequirePlugin = []string{required} }).start()
	h.registered(res1, devices("dev", 1))
	p := newPod("p", ctr("app", res1, 1, required, 1))
	q := newPod("q", ctr("app", res1, 1))
	h.pods.add(p, q)
	require.ErrorIs(t, h.admit(p), ErrUnregisteredResource)
	require.NoError(t, h.admit(q), "p's device was released")
	assert.Zero(t, h.m.ledger.Pending())
}

// TestAdmissionCollectsInactivePods: SPEC §3.2 step 3: admission garbage-collects inactive pods first.
func TestAdmissionCollectsInactivePods(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 1))
	a, b := newPod("a", ctr("app", res1, 1)), newPod("b", ctr("app", res1, 1))
	h.pods.add(a, b)
	require.NoError(t, h.admit(a))
	h.pods.remove(a.UID)
	require.NoError(t, h.admit(b), "a is no longer active: its device is free")
	assert.Nil(t, h.m.GetDevices("a", "app"))
}

// TestCheckpointFailureUndoesAllocation: Allocate doc + error text "allocation of %v undone".
func TestCheckpointFailureUndoesAllocation(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 1))
	s := h.faultyStore()
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	s.set(true, false)
	require.ErrorIs(t, h.admit(pod), ErrCheckpoint)
	assert.Nil(t, h.m.GetDevices("p", "app"))
	assert.Zero(t, h.m.ledger.AllocatedCount(res1))
}

// TestContainerAllocatedDuringPreferredCallIsNotAllocatedAgain: allocate.go "The world may have moved while the plugin thought".
func TestContainerAllocatedDuringPreferredCallIsNotAllocatedAgain(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 3), withOptions(false, true))
	gate, entered := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.SetPreferredAllocationFunc(func(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
		first := false
		once.Do(func() { first = true })
		if first {
			close(entered)
			<-gate
		}
		return &pluginapi.PreferredAllocationResponse{}, nil
	})
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	done := make(chan error, 1)
	go func() { done <- h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]) }()
	select {
	case <-entered:
	case <-time.After(waitTimeout):
		t.Fatal("the plugin's preferred allocation was never asked")
	}
	require.NoError(t, h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]))
	got := h.held(pod, "app", res1)
	close(gate)
	require.NoError(t, <-done)
	assert.Len(t, p.CallsOf(plugintest.MethodAllocate), 1)
	assert.Equal(t, got, h.held(pod, "app", res1))
}

// TestEmptyAllocateResponseFails: SPEC §3.2 step 8: an empty Allocate response is an error.
func TestEmptyAllocateResponseFails(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 1))
	p.SetAllocateFunc(func(context.Context, *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		return &pluginapi.AllocateResponse{}, nil
	})
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	err := h.admit(pod)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no containers return in allocation response")
	assert.Zero(t, h.m.ledger.AllocatedCount(res1), "device released")
}

// TestRunningShortCutOnlyBeforeSourcesReady: SPEC §3.3 step 2: the running-container short cut only applies while sources are not ready.
func TestRunningShortCutOnlyBeforeSourcesReady(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 1))
	pod := newPod("running", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	h.restart(podstate.ContainerMap{"cid": {PodUID: "running", ContainerName: "app"}}, sets.New("cid"))
	require.ErrorIs(t, h.admit(pod), ErrNoHealthyDevices, "sources ready: normal checks")
}

// TestRunOptionsAfterResourceCollected: SPEC §3.4: no primary endpoint -> "endpoint not found in cache".
func TestRunOptionsAfterResourceCollected(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 1))
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	p.CloseStreams()
	require.Equal(t, []string{res1}, h.stepUntilRemoved(res1))
	_, err := h.m.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
	assert.ErrorIs(t, err, ErrUnknownPlugin)
}

// TestCollectedResourceReportedOnce: GetCapacity doc: a removed resource is "reported once in removed".
func TestCollectedResourceReportedOnce(t *testing.T) {
	h := newHarness(t).start()
	p1 := h.registered(res1, devices("a", 1))
	p2 := h.registered(res2, devices("b", 1))
	p1.CloseStreams()
	require.Equal(t, []string{res1}, h.stepUntilRemoved(res1))
	p2.CloseStreams() // GetCapacity now takes the lock
	h.waitCapacity(res2, 1, 0)
	_, _, removed := h.m.GetCapacity()
	assert.Empty(t, removed)
}

// TestCapacityViewRefusedOnceAPrimaryStopped: capacity.go lists is false once a primary stopped.
func TestCapacityViewRefusedOnceAPrimaryStopped(t *testing.T) {
	v := &capacityView{names: []v1.ResourceName{res1}, capacity: []int64{1}, allocatable: []int64{1},
		primaries: []*endpoint.Endpoint{endpoint.NewStopped(res1, nil)}}
	_, _, ok := v.lists()
	assert.False(t, ok)
}

// TestAllocatableDevicesOmitsRestoredResource: SPEC §2.4 GetAllocatableDevices: restored resources whose plugin has not reported are omitted.
func TestAllocatableDevicesOmitsRestoredResource(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 1))
	h.restart(nil, nil)
	assert.NotContains(t, h.m.GetAllocatableDevices(), res1)
}

// TestShouldResetFalseOnListError: SPEC §2.4 ShouldResetExtendedResourceCapacity: false on list error.
func TestShouldResetFalseOnListError(t *testing.T) {
	h := newHarness(t)
	h.faultyStore().listErr = errors.New("boom")
	assert.False(t, h.m.ShouldResetExtendedResourceCapacity())
}

// TestReRegistrationWithSameListDoesNotRewrite: persist.go header: "a write that would not change the file is skipped".
func TestReRegistrationWithSameListDoesNotRewrite(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 2))
	path := filepath.Join(h.dir, checkpoint.DeviceManagerKey)
	h.eventually(func() bool { _, err := os.Stat(path); return err == nil }, "written")
	first, err := os.Stat(path)
	require.NoError(t, err)
	p.CloseStreams()
	h.waitCapacity(res1, 2, 0)
	h.register(p)
	p.Update([]*pluginapi.Device{dev("dev0", healthy, 0), dev("dev1", healthy)}) // applied after the re-registration's write
	h.waitDeviceTopology(res1, "dev0", 0)
	again, err := os.Stat(path)
	require.NoError(t, err)
	assert.True(t, os.SameFile(first, again))
}

// TestWriteAfterFailedWriteIsNotSkipped: persist.go "forget what it holds so the next write is not skipped".
func TestWriteAfterFailedWriteIsNotSkipped(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 2))
	h.eventually(func() bool { return slices.Equal(checkpointHealthy(h, res1), []string{"dev0", "dev1"}) }, "first write")
	s := h.faultyStore()
	s.set(true, true) // the file gets the new content, the store reports failure
	h.m.PluginListAndWatchReceiver(h.m.log, res1, &pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{dev("dev0", healthy), dev("dev1", sick)}})
	s.set(false, false)
	h.m.PluginListAndWatchReceiver(h.m.log, res1, &pluginapi.ListAndWatchResponse{Devices: devices("dev", 2)})
	assert.Equal(t, []string{"dev0", "dev1"}, checkpointHealthy(h, res1))
}

// checkpointHealthy returns the healthy IDs of res in the checkpoint file (nil if unreadable).
func checkpointHealthy(h *harness, res string) []string {
	store, err := checkpoint.NewManager(h.dir)
	require.NoError(h.t, err)
	data := checkpoint.New(nil, nil)
	if store.GetCheckpoint(checkpoint.DeviceManagerKey, data) != nil {
		return nil
	}
	_, registered := data.GetData()
	return registered[res]
}

// TestEndpointPathAtLimit: options.go a 107-byte socket path is accepted.
func TestEndpointPathAtLimit(t *testing.T) {
	h := newHarness(t)
	ep := strings.Repeat("x", maxSocketPath-len(h.opts.SocketDir)-1)
	path, err := h.m.endpointPath(ep)
	require.NoError(t, err)
	assert.Len(t, path, maxSocketPath)
}

// TestStaleInstanceMessageIgnored: applyDevices drops a message from a replaced instance.
func TestStaleInstanceMessageIgnored(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 2))
	h.m.mu.Lock()
	old := h.m.resources[res1].primary
	h.m.mu.Unlock()
	h.register(p) // same socket: replaces old
	p.Update([]*pluginapi.Device{dev("dev0", healthy, 0), dev("dev1", healthy)})
	h.waitDeviceTopology(res1, "dev0", 0) // the new instance's stream is applied
	h.m.onDevices(res1, old, []*pluginapi.Device{dev("dev0", sick), dev("dev1", sick)})
	c, a := h.capacity(res1)
	assert.Equal(t, []int64{2, 2}, []int64{c, a})
}

// TestNewestRemainingInstancePromoted: SPEC §3.8 + registration.go: the newest remaining instance is promoted.
func TestNewestRemainingInstancePromoted(t *testing.T) {
	h := newHarness(t).start()
	var ps []*plugintest.Plugin
	for _, n := range []string{"a.sock", "b.sock", "c.sock"} {
		ps = append(ps, h.registered(res1, devices("dev", 2), endpointName(n)))
	}
	ps[2].Stop()
	h.eventually(func() bool { return h.connections(res1) == 2 }, "c disconnected")
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	assert.Len(t, ps[1].CallsOf(plugintest.MethodAllocate), 1, "b, the newest left, is primary")
	assert.Empty(t, ps[0].CallsOf(plugintest.MethodAllocate))
}

// TestRegisterPluginZeroTimeout: SPEC §7.6: RegisterPlugin ignores the timeout (a zero one must not fail).
func TestRegisterPluginZeroTimeout(t *testing.T) {
	h := newHarness(t).start()
	p := h.plugin(res1, devices("dev", 1))
	zero := time.Duration(0)
	require.NoError(t, h.m.GetWatcherHandler().RegisterPlugin(res1, p.SocketPath(), []string{pluginapi.Version}, &zero))
	h.waitCapacity(res1, 1, 1)
}

// TestNilNodeToNodeZeroUpdatesTopology: sameTopology: a nil NUMA node differs from node 0.
func TestNilNodeToNodeZeroUpdatesTopology(t *testing.T) {
	r := newResource(res1)
	withNil := &pluginapi.Device{ID: "d", Health: healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{nil}}}
	r.setDevices([]*pluginapi.Device{withNil})
	r.setDevices([]*pluginapi.Device{dev("d", healthy, 0)})
	require.NotNil(t, r.device("d").Topology.Nodes[0])
}
