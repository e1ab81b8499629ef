package devicemanager

import (
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
func restartedWithoutPlugin(t *testing.T) (*harness, *v1.Pod) {
	t.Helper()
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 2))
	old := newPod("old", ctr("app", res1, 1))
	h.pods.add(old)
	require.NoError(t, h.admit(old))
	h.restart(nil, nil)
	fresh := newPod("fresh", ctr("app", res1, 1))
	h.pods.add(fresh)
	return h, fresh
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
	p := h.plugin(res1, devices("dev", 2))
	release := p.Block(plugintest.MethodListAndWatch)
	defer release()
	require.NoError(t, p.Register(h.kubeletSocket()))
	_, err := p.WaitForCalls(h.waitCtx(), plugintest.MethodListAndWatch, 1)
	require.NoError(t, err)

	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	err = h.admit(pod)
	require.ErrorIs(t, err, ErrPluginNotReady)
	assert.NotErrorIs(t, err, ErrUnregisteredResource)
	assert.EqualError(t, err, "cannot allocate unregistered device "+res1+
		": device plugin not ready (its plugin has not listed its devices yet)")

	release()
	h.waitCapacity(res1, 2, 2)
	require.NoError(t, h.admit(pod))
	assert.Len(t, h.held(pod, "app", res1), 1)
}
