package devicemanager

import (
	"context"
	"errors"
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
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podstate"
)

// Regression tests, each named after the upstream bug it pins.

// admitHeld admits pod in a goroutine of its own and returns once its
// Allocate call has reached p, whose Allocate calls the caller holds
// (plugintest's Block); admitted waits for the admission, which must
// succeed once the call is let through.
func (h *harness) admitHeld(p *plugintest.Plugin, pod *v1.Pod) (admitted func()) {
	h.t.Helper()
	before := len(p.CallsOf(plugintest.MethodAllocate))
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.NoError(h.t, h.admit(pod))
	}()
	waitCalls(h.t, p, plugintest.MethodAllocate, before+1)
	return func() { <-done }
}

func waitCalls(t testing.TB, p *plugintest.Plugin, m plugintest.Method, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	_, err := p.WaitForCalls(ctx, m, n)
	require.NoError(t, err)
}

// kubernetes#118559: running pods were killed when the kubelet restarted
// before their plugin re-registered. A container found running at start is
// admitted without checks while the sources are not ready, and its run
// options come from the checkpoint.
func TestRegression118559RunningContainerKeptAcrossRestart(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 2))
	pod := newPod("running", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	before, err := h.m.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
	require.NoError(t, err)
	require.Len(t, p.CallsOf(plugintest.MethodAllocate), 1)

	h.ready.set(false)
	h.restart(podstate.ContainerMap{"cid-1": {PodUID: "running", ContainerName: "app"}}, sets.New("cid-1"))
	c, a := h.capacity(res1)
	assert.Equal(t, []int64{0, 0}, []int64{c, a}, "restored resource: known, nothing allocatable until the plugin is back")

	require.NoError(t, h.admit(pod), "a running container is not re-checked")
	after, err := h.m.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
	require.NoError(t, err)
	assert.Equal(t, before, after)
	assert.Len(t, p.CallsOf(plugintest.MethodAllocate), 1, "no plugin call for a running container")

	// A container that is not running gets the normal checks: the plugin is
	// not back, so it is refused as not ready.
	fresh := newPod("fresh", ctr("app", res1, 1))
	h.pods.add(fresh)
	assert.ErrorIs(t, h.admit(fresh), ErrPluginNotReady)
}

// kubernetes#124345: a restarted container has several IDs (the exited one and
// the running one); any of them running counts. The pod's completed init
// container, not running but with its devices recorded, passes without a
// plugin call once the plugin is back.
func TestRegression124345InitContainersAndRestartedContainers(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 2))
	pod := newPod("p1", ctr("app", res1, 1))
	pod.Spec.InitContainers = []v1.Container{ctr("init", res1, 1)}
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))

	h.ready.set(false)
	containers := podstate.ContainerMap{
		"old-app":  {PodUID: "p1", ContainerName: "app"},
		"new-app":  {PodUID: "p1", ContainerName: "app"},
		"init-cid": {PodUID: "p1", ContainerName: "init"},
	}
	h.restart(containers, sets.New("new-app"))
	require.NoError(t, h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]),
		"running under its second container ID")

	// Start removed the old plugin socket; the plugin restarts and registers.
	p := h.registered(res1, devices("dev", 2))
	require.NoError(t, h.m.Allocate(context.Background(), pod, &pod.Spec.InitContainers[0]),
		"completed init container: devices recorded and healthy")
	assert.Empty(t, p.CallsOf(plugintest.MethodAllocate))
	assert.Equal(t, []string{"dev0"}, h.held(pod, "init", res1))
	assert.Equal(t, []string{"dev0"}, h.held(pod, "app", res1), "the app container reused the init container's device")
}

// kubernetes#109595: after a node reboot, pods were admitted before their
// plugin came back and ran without their devices. Admission is refused with
// the kubelet's text, as not ready (a caller can tell it from a plugin
// without healthy devices), until the plugin reports healthy devices, then
// works; a container whose devices are recorded and healthy needs no new
// call.
func TestRegression109595NoAdmissionBeforePluginReturns(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 2))
	old := newPod("old", ctr("app", res1, 1))
	h.pods.add(old)
	require.NoError(t, h.admit(old))

	h.restart(nil, nil) // a reboot: nothing runs
	fresh := newPod("fresh", ctr("app", res1, 1))
	h.pods.add(fresh)
	err := h.admit(fresh)
	require.ErrorIs(t, err, ErrPluginNotReady)
	assert.NotErrorIs(t, err, ErrNoHealthyDevices)
	assert.EqualError(t, err, "no healthy devices present; cannot allocate unhealthy devices "+res1+
		": device plugin not ready (no plugin instance is connected)")
	assert.ErrorIs(t, h.admit(old), ErrPluginNotReady)

	p := h.registered(res1, devices("dev", 2)) // the plugin restarts too
	require.NoError(t, h.admit(old))
	assert.Empty(t, p.CallsOf(plugintest.MethodAllocate), "recorded devices are healthy again: no call")
	require.NoError(t, h.admit(fresh))
	assert.Equal(t, []string{"dev1"}, h.held(fresh, "app", res1))
}

// kubernetes#116125: the checkpoint was lost and the plugin not back yet, so
// the kubelet did not know the GPU resource and started the pod without its
// GPU. With RequirePlugin naming the resource, admission fails instead.
func TestRegression116125RequirePlugin(t *testing.T) {
	pod := newPod("p", ctr("app", "nvidia.com/gpu", 1))

	h := newHarness(t).start()
	h.pods.add(pod)
	require.NoError(t, h.admit(pod), "the kubelet's behaviour: an unknown extended resource is ignored")
	assert.Nil(t, h.m.GetDevices("p", "app"))

	for _, require1 := range []string{"nvidia.com/gpu", "nvidia.com/*"} {
		t.Run(require1, func(t *testing.T) {
			h := newHarness(t, func(o *Options) { o.RequirePlugin = []string{require1} }).start()
			h.pods.add(pod)
			err := h.admit(pod)
			require.ErrorIs(t, err, ErrUnregisteredResource)
			assert.EqualError(t, err, "cannot allocate unregistered device nvidia.com/gpu")

			h.registered("nvidia.com/gpu", devices("gpu", 1))
			require.NoError(t, h.admit(pod))
			assert.Equal(t, []string{"gpu0"}, h.held(pod, "app", "nvidia.com/gpu"))
		})
	}
	h2 := newHarness(t, func(o *Options) { o.RequirePlugin = []string{"other.com/*"} }).start()
	h2.pods.add(pod)
	assert.NoError(t, h2.admit(pod), "other domains are not required")
}

// kubernetes#137534 (PR): devices picked for a plugin call in flight could be
// handed to a second pod when garbage collection ran meanwhile. A pending
// reservation survives garbage collection.
func TestRegression137534NoDeviceTwiceDuringInflightCall(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 2))
	// Hold the first Allocate call (pod a's) until released; others answer.
	// entered is closed once that call is held, so that pod b is admitted
	// only after it (the order calls are recorded in is not the order
	// they reach the hook).
	gate, entered := make(chan struct{}), make(chan struct{})
	var calls sync.Mutex
	first := true
	p.SetAllocateFunc(func(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		calls.Lock()
		wait := first
		first = false
		calls.Unlock()
		if wait {
			close(entered)
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return p.DefaultAllocate(req), nil
	})
	release := func() { close(gate) }

	a := newPod("a", ctr("app", res1, 1)) // not in the active list: GC would drop it
	errA := make(chan error, 1)
	go func() { errA <- h.admit(a) }()
	select {
	case <-entered:
	case <-time.After(waitTimeout):
		t.Fatal("pod a's Allocate never reached the plugin")
	}

	h.m.UpdateAllocatedDevices()
	b := newPod("b", ctr("app", res1, 1))
	h.pods.add(b)
	require.NoError(t, h.admit(b))
	release()
	require.NoError(t, <-errA)

	heldA, heldB := h.held(a, "app", res1), h.held(b, "app", res1)
	require.Len(t, heldA, 1)
	require.Len(t, heldB, 1)
	assert.NotEqual(t, heldA, heldB, "the same device went to two pods")

	// Once a is active, both devices are taken; while it is not, garbage
	// collection frees its record (but never its reservation).
	h.pods.add(a)
	c := newPod("c", ctr("app", res1, 1))
	h.pods.add(c)
	assert.ErrorIs(t, h.admit(c), ErrInsufficientDevices)
}

// kubernetes#121994: when a plugin was updated (new instance, new socket), the
// old instance's late disconnect tore down the new one. It must not, on a new
// socket nor on the same socket.
func TestRegression121994LateDisconnectOfOldInstance(t *testing.T) {
	t.Run("new socket", func(t *testing.T) {
		h := newHarness(t).start()
		old := h.registered(res1, devices("dev", 2), func(o *plugintest.Options) { o.Endpoint = "v1.sock" })
		h.registered(res1, devices("dev", 3), func(o *plugintest.Options) { o.Endpoint = "v2.sock" })
		old.Stop()
		// The old stream's end has been handled once the old instance is
		// gone; the resource stays served by the new one.
		pod := newPod("p", ctr("app", res1, 3))
		h.pods.add(pod)
		h.eventually(func() bool { return h.admit(pod) == nil }, "admission through the new instance")
		c, a := h.capacity(res1)
		assert.Equal(t, []int64{3, 3}, []int64{c, a})
	})
	t.Run("same socket", func(t *testing.T) {
		h := newHarness(t).start()
		old := h.registered(res1, devices("dev", 2), func(o *plugintest.Options) { o.Endpoint = "p.sock" })
		// The plugin restarts: a new process on the same socket registers
		// before the old one's stream has ended.
		newer := h.plugin(res1, devices("dev", 3), func(o *plugintest.Options) { o.Endpoint = "p.sock" })
		require.NoError(t, newer.Register(h.kubeletSocket()))
		h.waitCapacity(res1, 3, 3)
		old.Stop()
		pod := newPod("p", ctr("app", res1, 3))
		h.pods.add(pod)
		require.NoError(t, h.admit(pod))
		assert.Len(t, newer.CallsOf(plugintest.MethodAllocate), 1)
		c, a := h.capacity(res1)
		assert.Equal(t, []int64{3, 3}, []int64{c, a})
	})
}

// kubernetes#114422: GetCapacity (and every getter) before Start.
func TestRegression114422GettersBeforeStart(t *testing.T) {
	h := newHarness(t)
	c, a, removed := h.m.GetCapacity()
	assert.Empty(t, c)
	assert.Empty(t, a)
	assert.Empty(t, removed)
	assert.Empty(t, h.m.GetAllocatableDevices())
	assert.Nil(t, h.m.GetDevices("p", "c"))
	pod := newPod("p", ctr("c", res1, 1))
	assert.Empty(t, h.m.GetTopologyHints(pod, &pod.Spec.Containers[0]))
	assert.Empty(t, h.m.GetPodTopologyHints(pod))
	h.m.UpdateAllocatedDevices()
	assert.NoError(t, h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]))
	assert.Error(t, h.m.HealthCheck())
	assert.True(t, h.m.ShouldResetExtendedResourceCapacity())
}

// kubernetes#92958: when a plugin's stream ended, its resource dropped to zero
// capacity at once and the plugin could not come back. It stays visible (its
// devices unhealthy) for the grace period, and re-registration works at any
// time, also after the resource was removed.
func TestRegression92958StreamEndKeepsResourceForGracePeriod(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 2))
	p.CloseStreams()
	h.waitCapacity(res1, 2, 0)

	h.clock.Step(DefaultStopGracePeriod)
	h.waitCapacity(res1, 2, 0) // not strictly past the grace period yet
	require.NoError(t, p.Register(h.kubeletSocket()))
	h.waitCapacity(res1, 2, 2)

	p.CloseStreams()
	h.waitCapacity(res1, 2, 0)
	h.clock.Step(DefaultStopGracePeriod + time.Second)
	_, _, removed := h.m.GetCapacity()
	assert.Equal(t, []string{res1}, removed, "removed once")
	_, _, removed = h.m.GetCapacity()
	assert.Empty(t, removed)
	c, _ := h.capacity(res1)
	assert.Equal(t, int64(-1), c)

	require.NoError(t, p.Register(h.kubeletSocket()))
	h.waitCapacity(res1, 2, 2)
}

// A plugin that hangs in Allocate delays only the pods that need it.
func TestHungPluginDelaysOnlyItsResource(t *testing.T) {
	h := newHarness(t).start()
	slow := h.registered(res1, devices("a", 1), func(o *plugintest.Options) { o.Endpoint = "slow.sock" })
	h.registered(res2, devices("b", 1), func(o *plugintest.Options) { o.Endpoint = "fast.sock" })
	release := slow.Block(plugintest.MethodAllocate)
	defer release()

	stuck := newPod("stuck", ctr("app", res1, 1))
	admitted := h.admitHeld(slow, stuck)

	other := newPod("other", ctr("app", res2, 1))
	h.pods.add(other, stuck)
	require.NoError(t, h.admit(other))
	c, a := h.capacity(res2)
	assert.Equal(t, []int64{1, 1}, []int64{c, a})
	release()
	admitted()
	assert.Equal(t, []string{"a0"}, h.held(stuck, "app", res1))
}

// A plugin that never answers costs the admission CallTimeout, and the
// devices it was offered are free again afterwards.
func TestAllocateDeadlineRollsBack(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.CallTimeout = 100 * time.Millisecond }).start()
	p := h.registered(res1, devices("dev", 1))
	release := p.Block(plugintest.MethodAllocate)
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	err := h.admit(pod)
	require.ErrorIs(t, err, ErrPluginCall)
	assert.ErrorContains(t, err, "DeadlineExceeded")
	assert.Nil(t, h.m.GetDevices("p", "app"))
	st := h.m.Status()
	require.Len(t, st, 1)
	assert.Equal(t, 1, st[0].Free, "the device was released")
	assert.Equal(t, 0, st[0].Allocated)
	release()
	// The plugin answers this time, but within 100 ms only: on a loaded
	// machine (the race detector, other tests' fsyncs) the call may miss
	// the deadline again, which rolls back the same way; a device still
	// held would fail with another error.
	for attempt := 1; ; attempt++ {
		err = h.admit(pod)
		if err == nil || attempt == 5 || !errors.Is(err, ErrPluginCall) || !strings.Contains(err.Error(), "DeadlineExceeded") {
			break
		}
	}
	require.NoError(t, err, "the device was released")
	assert.Equal(t, []string{"dev0"}, h.held(pod, "app", res1))
}

// TestCollectKeepsActivePods: garbage collection drops the records of the
// pods that left the active list and only theirs. The active pods keep
// their devices as they were, with no new plugin call, and the next write
// of the checkpoint leaves out exactly the collected pod.
func TestCollectKeepsActivePods(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 4))
	pods := []*v1.Pod{newPod("a", ctr("app", res1, 1)), newPod("b", ctr("app", res1, 1)), newPod("c", ctr("app", res1, 1))}
	held := map[string][]string{}
	for _, pod := range pods {
		h.pods.add(pod)
		require.NoError(t, h.admit(pod))
		held[pod.Name] = h.held(pod, "app", res1)
		require.Len(t, held[pod.Name], 1)
	}
	h.pods.remove(pods[1].UID)
	h.m.UpdateAllocatedDevices()

	assert.Nil(t, h.m.GetDevices("b", "app"), "b left the active pods")
	for _, pod := range []*v1.Pod{pods[0], pods[2]} {
		assert.Equal(t, held[pod.Name], h.held(pod, "app", res1), "%s is still active", pod.Name)
	}
	assert.Len(t, p.CallsOf(plugintest.MethodAllocate), 3, "no pod was allocated again")

	d := newPod("d", ctr("app", res1, 1))
	h.pods.add(d)
	require.NoError(t, h.admit(d))
	store, err := checkpoint.NewManager(h.dir)
	require.NoError(t, err)
	cp := checkpoint.New(nil, nil)
	require.NoError(t, store.GetCheckpoint(checkpoint.DeviceManagerKey, cp))
	entries, _ := cp.GetData()
	var uids []string
	for _, e := range entries {
		uids = append(uids, e.PodUID)
	}
	assert.ElementsMatch(t, []string{"a", "c", "d"}, uids)
}

// TestCollectKeepsPodBeingAdmitted: a pod that is not in the active list
// keeps its records while one of its containers is being admitted (here
// its second container, whose plugin call is blocked).
func TestCollectKeepsPodBeingAdmitted(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 2))
	pod := newPod("multi", ctr("c1", res1, 1), ctr("c2", res1, 1)) // never in the active pods
	require.NoError(t, h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]))
	first := h.held(pod, "c1", res1)
	require.Len(t, first, 1)

	release := p.Block(plugintest.MethodAllocate)
	defer release()
	done := make(chan error, 1)
	go func() { done <- h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[1]) }()
	_, err := p.WaitForCalls(waitCtx(t), plugintest.MethodAllocate, 2)
	require.NoError(t, err)
	h.m.UpdateAllocatedDevices()
	assert.Equal(t, first, h.held(pod, "c1", res1), "collected while its second container is being admitted")
	release()
	require.NoError(t, <-done)
	assert.Len(t, h.held(pod, "c2", res1), 1)
}

// TestCollectKeepsPodAdmittedAfterListRead: a collection whose list of
// active pods was read before a pod's admission committed does not drop
// that pod, which the list could not contain.
func TestCollectKeepsPodAdmittedAfterListRead(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 2))
	entered, proceed := make(chan struct{}), make(chan struct{})
	h.pods.onNextGet(func([]*v1.Pod) {
		close(entered)
		<-proceed
	})
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		h.m.UpdateAllocatedDevices()
	}()
	select {
	case <-entered:
	case <-time.After(waitTimeout):
		t.Fatal("the collection never read the active pods")
	}

	pod := newPod("late", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	held := h.held(pod, "app", res1)
	require.Len(t, held, 1)
	close(proceed)
	select {
	case <-collected:
	case <-time.After(waitTimeout):
		t.Fatal("the collection did not finish")
	}
	assert.Equal(t, held, h.held(pod, "app", res1), "collected with a list read before its admission")
}
