package devicemanager

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podstate"
)

// Admitting a pod drops every other pod's reuse pool: a later container of the
// first pod does not take its init container's device.
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

// A resource that fails admission releases what the same call reserved for
// the container's earlier resources.
func TestRequirePluginFailureReleasesEarlierResources(t *testing.T) {
	const required = "zzz.example.com/gpu" // sorts after res1, never registered
	h := newHarness(t, func(o *Options) { o.RequirePlugin = []string{required} }).start()
	h.registered(res1, devices("dev", 1))
	p := newPod("p", ctr("app", res1, 1, required, 1))
	q := newPod("q", ctr("app", res1, 1))
	h.pods.add(p, q)
	require.ErrorIs(t, h.admit(p), ErrUnregisteredResource)
	require.NoError(t, h.admit(q), "p's device was released")
	assert.Zero(t, h.m.core.ledger.Pending())
}

// An admission garbage-collects inactive pods first, so their devices are free.
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

// A failed checkpoint write undoes the admission: the container holds
// nothing and the error wraps ErrCheckpoint.
func TestCheckpointFailureUndoesAllocation(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 1))
	s := h.faultyStore()
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	s.set(true, false)
	require.ErrorIs(t, h.admit(pod), ErrCheckpoint)
	assert.Nil(t, h.m.GetDevices("p", "app"))
	assert.Zero(t, h.m.core.ledger.AllocatedCount(res1))
}

// A container allocated while another call for it waited on the plugin's
// preferred allocation is not allocated again: the waiting call starts over
// from the state after the plugin's answer.
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

// An Allocate response with no container response fails the admission, with
// the kubelet's text, and releases the device.
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
	assert.Zero(t, h.m.core.ledger.AllocatedCount(res1), "device released")
}

// A container found running at start skips the health checks only while the
// pod sources are not ready.
func TestRunningShortCutOnlyBeforeSourcesReady(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 1))
	pod := newPod("running", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	h.restart(podstate.ContainerMap{"cid": {PodUID: "running", ContainerName: "app"}}, sets.New("cid"))
	require.ErrorIs(t, h.admit(pod), ErrPluginNotReady, "sources ready: normal checks")
}

// Run options for a resource whose plugin is gone for good fail with
// ErrUnknownPlugin (the kubelet's "endpoint not found in cache").
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
