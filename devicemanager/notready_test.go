package devicemanager

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
)

// restartedWithoutPlugin admits a pod on res1, then restarts the manager as
// after a reboot: res1 is known from the checkpoint, no plugin is back. It
// returns a new pod asking for one device of res1, active.
func restartedWithoutPlugin(t *testing.T, tune ...func(*Options)) (*harness, *v1.Pod) {
	t.Helper()
	h := newHarness(t, tune...).start()
	h.registered(res1, devices("dev", 2))
	old := newPod("old", ctr("app", res1, 1))
	h.pods.add(old)
	require.NoError(t, h.admit(old))
	h.restart(nil, nil)
	fresh := newPod("fresh", ctr("app", res1, 1))
	h.pods.add(fresh)
	return h, fresh
}

// allocateAsync runs Allocate for pod's first container; the manager's Stop,
// at the latest, ends it.
func (h *harness) allocateAsync(ctx context.Context, pod *v1.Pod) <-chan error {
	done := make(chan error, 1)
	go func() { done <- h.m.Allocate(ctx, pod, &pod.Spec.Containers[0]) }()
	return done
}

// allocateResult waits up to waitTimeout for the result of allocateAsync.
func (h *harness) allocateResult(done <-chan error) error {
	h.t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(waitTimeout):
		require.FailNow(h.t, "Allocate did not return")
		return nil
	}
}

// waitWaiting waits until an Allocate call waits for its plugin: its timer
// is the only one on the harness's clock.
func (h *harness) waitWaiting() {
	h.t.Helper()
	h.eventually(h.clock.HasWaiters, "Allocate waits for the plugin")
}

// requireWaiting fails the test if the Allocate call of allocateAsync has
// returned.
func (h *harness) requireWaiting(done <-chan error) {
	h.t.Helper()
	select {
	case err := <-done:
		require.FailNow(h.t, "Allocate returned while it should wait", "%v", err)
	default:
	}
}

// registeredWithoutList starts and registers a plugin of res1 whose
// ListAndWatch stream sends nothing until release is called (or the test
// ends).
func (h *harness) registeredWithoutList(devs []*pluginapi.Device) (release func()) {
	h.t.Helper()
	p := h.plugin(res1, devs)
	release = p.Block(plugintest.MethodListAndWatch)
	h.t.Cleanup(release)
	require.NoError(h.t, p.Register(h.kubeletSocket()))
	_, err := p.WaitForCalls(h.waitCtx(), plugintest.MethodListAndWatch, 1)
	require.NoError(h.t, err)
	return release
}

// The sentinels tell a resource whose plugin is not back from one whose
// plugin lists no healthy device, and both from too few free devices; the
// message keeps the kubelet's text first.
func TestNotReadyToldApartFromUnhealthyAndInsufficient(t *testing.T) {
	t.Run("restored from the checkpoint, no plugin yet", func(t *testing.T) {
		h, pod := restartedWithoutPlugin(t)
		err := h.admit(pod)
		require.ErrorIs(t, err, ErrPluginNotReady)
		assert.NotErrorIs(t, err, ErrNoHealthyDevices)
		assert.NotErrorIs(t, err, ErrInsufficientDevices)
		assert.EqualError(t, err, "no healthy devices present; cannot allocate unhealthy devices "+res1+
			": device plugin not ready (no plugin instance is connected)")
		assert.Nil(t, h.m.GetDevices("fresh", "app"))
	})
	t.Run("plugin gone within the grace period", func(t *testing.T) {
		h := newHarness(t).start()
		p := h.registered(res1, devices("dev", 2))
		p.CloseStreams()
		h.waitCapacity(res1, 2, 0)
		h.clock.Step(DefaultStopGracePeriod - time.Second)
		pod := newPod("p", ctr("app", res1, 1))
		h.pods.add(pod)
		require.ErrorIs(t, h.admit(pod), ErrPluginNotReady)

		// Past the grace period the plugin is not coming back: the
		// kubelet's refusal, until GetCapacity removes the resource.
		h.clock.Step(2 * time.Second)
		err := h.admit(pod)
		require.ErrorIs(t, err, ErrNoHealthyDevices)
		assert.NotErrorIs(t, err, ErrPluginNotReady)
	})
	t.Run("connected plugin listing only unhealthy devices", func(t *testing.T) {
		h := newHarness(t).start()
		h.registered(res1, []*pluginapi.Device{dev("d0", sick), dev("d1", sick)})
		pod := newPod("p", ctr("app", res1, 1))
		h.pods.add(pod)
		err := h.admit(pod)
		require.ErrorIs(t, err, ErrNoHealthyDevices)
		assert.NotErrorIs(t, err, ErrPluginNotReady)
		assert.EqualError(t, err, "no healthy devices present; cannot allocate unhealthy devices "+res1)
	})
	t.Run("connected plugin with too few free devices", func(t *testing.T) {
		h := newHarness(t).start()
		h.registered(res1, devices("dev", 1))
		pod := newPod("p", ctr("app", res1, 2))
		h.pods.add(pod)
		err := h.admit(pod)
		require.ErrorIs(t, err, ErrInsufficientDevices)
		assert.NotErrorIs(t, err, ErrPluginNotReady)
	})
}

// A plugin that registered but has not sent its first device list is not
// ready either: the pod is refused, not started without its device as an
// extended resource nobody serves would be.
func TestConnectedPluginWithoutListIsNotReady(t *testing.T) {
	h := newHarness(t).start()
	release := h.registeredWithoutList(devices("dev", 2))

	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	err := h.admit(pod)
	require.ErrorIs(t, err, ErrPluginNotReady)
	assert.NotErrorIs(t, err, ErrUnregisteredResource)
	assert.EqualError(t, err, "cannot allocate unregistered device "+res1+
		": device plugin not ready (its plugin has not listed its devices yet)")

	release()
	h.waitCapacity(res1, 2, 2)
	require.NoError(t, h.admit(pod))
	assert.Len(t, h.held(pod, "app", res1), 1)
}

// With PluginWaitTimeout, an admission waits for the plugin and succeeds
// once it registers and lists its devices.
func TestWaitForPluginAdmitsWhenItRegisters(t *testing.T) {
	h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Minute })
	done := h.allocateAsync(context.Background(), pod)
	h.waitWaiting()
	h.requireWaiting(done)
	h.registered(res1, devices("dev", 2))
	require.NoError(t, h.allocateResult(done))
	assert.Equal(t, []string{"dev1"}, h.held(pod, "app", res1), "dev0 is the restored pod's")
	assert.False(t, h.clock.HasWaiters(), "the wait's timer is stopped")
}

// The wait also ends when a plugin that registered sends its first list.
func TestWaitForPluginEndsWithItsFirstList(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.PluginWaitTimeout = time.Minute }).start()
	release := h.registeredWithoutList(devices("dev", 1))

	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	done := h.allocateAsync(context.Background(), pod)
	h.waitWaiting()
	release()
	require.NoError(t, h.allocateResult(done))
	assert.Equal(t, []string{"dev0"}, h.held(pod, "app", res1))
}

// An empty device list does not end the wait (some plugins send one before
// their devices); the list that names them does.
func TestWaitForPluginOutlastsAnEmptyList(t *testing.T) {
	h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Minute })
	done := h.allocateAsync(context.Background(), pod)
	h.waitWaiting()
	p := h.plugin(res1, nil)
	require.NoError(t, p.Register(h.kubeletSocket()))
	h.eventually(func() bool {
		st := h.m.Status()
		return len(st) == 1 && !st[0].RestoredFromCheckpoint
	}, "the empty list is applied")
	h.requireWaiting(done)
	p.Update(devices("dev", 2))
	require.NoError(t, h.allocateResult(done))
	assert.Equal(t, []string{"dev1"}, h.held(pod, "app", res1))
}

// Past the grace period a restored resource is not waited for: its plugin
// is not coming back, and the kubelet's refusal stands at once.
func TestWaitForPluginNotPastTheGracePeriod(t *testing.T) {
	h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Hour })
	h.clock.Step(DefaultStopGracePeriod + time.Second)
	err := h.allocateResult(h.allocateAsync(context.Background(), pod))
	require.ErrorIs(t, err, ErrNoHealthyDevices)
	assert.NotErrorIs(t, err, ErrPluginNotReady)
}

// A wait ends when the resource's grace period does: the resource is then
// no longer "not ready", and the admission refuses as it would at once.
func TestWaitForPluginEndsWithTheGracePeriod(t *testing.T) {
	h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Hour })
	done := h.allocateAsync(context.Background(), pod)
	// Two timers: the wait's own, then the grace period's. The fake clock
	// fires a timer only when it steps past it, so the steps wait for both.
	h.eventually(func() bool { return h.clock.Waiters() == 2 }, "Allocate waits for the plugin and the grace period")
	h.clock.Step(DefaultStopGracePeriod - time.Second)
	h.requireWaiting(done)
	h.clock.Step(2 * time.Second)
	err := h.allocateResult(done)
	require.ErrorIs(t, err, ErrNoHealthyDevices)
	assert.NotErrorIs(t, err, ErrPluginNotReady)
}

// A wait that runs out refuses with ErrPluginNotReady, as without a wait.
func TestWaitForPluginExpires(t *testing.T) {
	h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Minute })
	done := h.allocateAsync(context.Background(), pod)
	h.waitWaiting()
	h.clock.Step(time.Minute - time.Second)
	h.requireWaiting(done)
	h.clock.Step(time.Second)
	err := h.allocateResult(done)
	require.ErrorIs(t, err, ErrPluginNotReady)
	assert.NotErrorIs(t, err, ErrNoHealthyDevices)
	assert.Nil(t, h.m.GetDevices("fresh", "app"))
}

// A caller's context that ends stops the wait at once: the error wraps
// both ErrPluginNotReady and the context's error.
func TestWaitForPluginHonoursTheContext(t *testing.T) {
	t.Run("cancelled while waiting", func(t *testing.T) {
		h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Hour })
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := h.allocateAsync(ctx, pod)
		h.waitWaiting()
		cancel() // the fake clock never moves: only the cancel can end the wait
		err := h.allocateResult(done)
		require.ErrorIs(t, err, ErrPluginNotReady)
		require.ErrorIs(t, err, context.Canceled)
		assert.EqualError(t, err, "no healthy devices present; cannot allocate unhealthy devices "+res1+
			": device plugin not ready (no plugin instance is connected): context canceled")
		assert.Nil(t, h.m.GetDevices("fresh", "app"))
	})
	t.Run("already cancelled", func(t *testing.T) {
		h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Hour })
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := h.allocateResult(h.allocateAsync(ctx, pod))
		require.ErrorIs(t, err, ErrPluginNotReady)
		require.ErrorIs(t, err, context.Canceled)
	})
}

// Stop ends a wait with ErrStopped.
func TestWaitForPluginEndsWithStop(t *testing.T) {
	h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Hour })
	done := h.allocateAsync(context.Background(), pod)
	h.waitWaiting()
	require.NoError(t, h.m.Stop())
	require.ErrorIs(t, h.allocateResult(done), ErrStopped)
}

// A waiting admission holds no lock: other admissions and status are served
// meanwhile.
func TestWaitForPluginBlocksNobodyElse(t *testing.T) {
	h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Hour })
	done := h.allocateAsync(context.Background(), pod)
	h.waitWaiting()

	h.registered(res2, devices("nic", 1))
	other := newPod("other", ctr("app", res2, 1))
	h.pods.add(other)
	require.NoError(t, h.admit(other))
	assert.Len(t, h.m.Status(), 2)
	h.requireWaiting(done)

	h.registered(res1, devices("dev", 2))
	require.NoError(t, h.allocateResult(done))
}

// A resource that is not known is not waited for: an extended resource no
// plugin serves is ignored at once, as without a wait.
func TestWaitForPluginSkipsUnknownResources(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.PluginWaitTimeout = time.Hour }).start()
	pod := newPod("p", ctr("app", "example.com/by-hand", 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	assert.False(t, h.clock.HasWaiters())
}

func TestNegativePluginWaitTimeoutRefused(t *testing.T) {
	dir, err := os.MkdirTemp("", "dm")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	_, err = NewManagerImpl(Options{SocketDir: dir, PluginWaitTimeout: -time.Second})
	require.ErrorContains(t, err, "bad PluginWaitTimeout -1s: must not be negative")
}

// WaitForPlugins waits as Allocate would, without allocating: nil once the
// plugin is ready, else the refusal Allocate would give when the wait ends.
func TestWaitForPluginsWaitsWithoutAllocating(t *testing.T) {
	waitAsync := func(h *harness, ctx context.Context, pod *v1.Pod) <-chan error {
		done := make(chan error, 1)
		go func() { done <- h.m.WaitForPlugins(ctx, pod, &pod.Spec.Containers[0]) }()
		return done
	}
	t.Run("plugin back", func(t *testing.T) {
		h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Minute })
		done := waitAsync(h, context.Background(), pod)
		h.waitWaiting()
		h.requireWaiting(done)
		h.registered(res1, devices("dev", 2))
		require.NoError(t, h.allocateResult(done))
		assert.Nil(t, h.m.GetDevices("fresh", "app"), "nothing is allocated")
		assert.False(t, h.clock.HasWaiters(), "the wait's timer is stopped")
		require.NoError(t, h.admit(pod), "Allocate finds the plugin ready")
	})
	t.Run("time up", func(t *testing.T) {
		h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Minute })
		done := waitAsync(h, context.Background(), pod)
		h.waitWaiting()
		h.clock.Step(time.Minute)
		err := h.allocateResult(done)
		require.ErrorIs(t, err, ErrPluginNotReady)
		assert.EqualError(t, err, "no healthy devices present; cannot allocate unhealthy devices "+res1+
			": device plugin not ready (no plugin instance is connected)")
	})
	t.Run("time up with an empty list", func(t *testing.T) {
		h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Minute })
		h.registered(res1, nil)
		h.eventually(func() bool {
			st := h.m.Status()
			return len(st) == 1 && !st[0].RestoredFromCheckpoint
		}, "the empty list is applied")
		done := waitAsync(h, context.Background(), pod)
		h.waitWaiting()
		h.clock.Step(time.Minute)
		err := h.allocateResult(done)
		require.ErrorIs(t, err, ErrNoHealthyDevices)
		assert.NotErrorIs(t, err, ErrPluginNotReady)
	})
	t.Run("context ends", func(t *testing.T) {
		h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Hour })
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := h.allocateResult(waitAsync(h, ctx, pod))
		require.ErrorIs(t, err, ErrPluginNotReady)
		require.ErrorIs(t, err, context.Canceled)
	})
	t.Run("no wait configured", func(t *testing.T) {
		h, pod := restartedWithoutPlugin(t)
		require.NoError(t, h.allocateResult(waitAsync(h, context.Background(), pod)))
		require.ErrorIs(t, h.admit(pod), ErrPluginNotReady, "Allocate refuses at once")
	})
	t.Run("stopped", func(t *testing.T) {
		h, pod := restartedWithoutPlugin(t, func(o *Options) { o.PluginWaitTimeout = time.Hour })
		require.NoError(t, h.m.Stop())
		require.ErrorIs(t, h.allocateResult(waitAsync(h, context.Background(), pod)), ErrStopped)
	})
}
