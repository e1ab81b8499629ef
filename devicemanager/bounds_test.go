package devicemanager

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
)

// errorLogged reports whether buf holds an error entry wrapping want whose
// message contains every one of parts.
func errorLogged(buf ktesting.Buffer, want error, parts ...string) bool {
	return slices.ContainsFunc(buf.Data(), func(e ktesting.LogEntry) bool {
		return e.Type == ktesting.LogError && errors.Is(e.Err, want) &&
			!slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(e.Err.Error(), p) })
	})
}

// A relayed list over the limit does what it would on the stream: the
// primary instance is disconnected and the list is not applied.
func TestMaxDevicesPerResourceRelayed(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxDevicesPerResource = 2 }).start()
	p := h.registered(res1, devices("d", 2))
	h.m.PluginListAndWatchReceiver(h.m.log, res1, &pluginapi.ListAndWatchResponse{Devices: devices("d", 3)})
	c, a := h.capacity(res1)
	assert.Equal(t, [2]int64{2, 0}, [2]int64{c, a}, "disconnected before it returns")
	require.NoError(t, p.WaitForStreams(h.waitCtx(), 0))
}

// requireOverLimit registers p and checks that the manager refuses it with
// ResourceExhausted and a message holding every one of parts, without
// dialling it back.
func (h *harness) requireOverLimit(p *plugintest.Plugin, parts ...string) {
	h.t.Helper()
	err := p.Register(h.kubeletSocket())
	require.Error(h.t, err)
	assert.Equal(h.t, codes.ResourceExhausted, status.Code(err), "%v", err)
	for _, part := range parts {
		assert.ErrorContains(h.t, err, part)
	}
	assert.Empty(h.t, p.CallsOf(plugintest.MethodGetDevicePluginOptions), "never dialled back")
}

// A list of exactly MaxDevicesPerResource devices is applied; one more
// disconnects the instance that sent it, loses no allocation, and leaves the
// other plugins alone.
func TestMaxDevicesPerResource(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	logger, buf := bufferedLogger(t)
	h := newHarness(t, func(o *Options) {
		o.MaxDevicesPerResource = 4
		o.Registerer = reg
		o.Logger = logger
	}).start()
	gpu := h.registered(res1, devices("g", 4)) // exactly the limit
	nic := h.registered(res2, devices("n", 2))
	pod := newPod("p1", ctr("app", res1, 1, res2, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	held := h.held(pod, "app", res1)
	require.Len(t, held, 1)

	gpu.Update(devices("g", 5))
	// The list is not applied: the devices stay as they were, unhealthy
	// since their only instance is gone, and the plugin sees its stream end.
	h.waitCapacity(res1, 4, 0)
	require.NoError(t, gpu.WaitForStreams(h.waitCtx(), 0))
	h.eventually(func() bool {
		return errorLogged(buf, ErrPluginLimit, res1, "listed 5 devices", "(MaxDevicesPerResource) is 4")
	}, "an error log naming the resource, the count and the limit")
	assert.InDelta(t, 1, testutil.ToFloat64(h.m.metrics.refused.WithLabelValues(res1, reasonDevices)), 0)
	assert.Equal(t, 1, testutil.CollectAndCount(h.m.metrics.refused))
	assert.Equal(t, held, h.held(pod, "app", res1), "the allocation stays")

	// The other plugin is still followed and still allocates.
	nic.Update(devices("n", 3))
	h.waitCapacity(res2, 3, 3)
	other := newPod("p2", ctr("app", res2, 2))
	h.pods.add(other)
	require.NoError(t, h.admit(other))
	assert.Len(t, h.held(other, "app", res2), 2)

	// The plugin comes back by registering again, within the limit.
	gpu.Update(devices("g", 4))
	h.register(gpu)
	assert.Equal(t, held, h.held(pod, "app", res1))
}

// A registration of one resource more than MaxResources is refused with
// ResourceExhausted; a resource counts until GetCapacity removes it.
func TestMaxResources(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	h := newHarness(t, func(o *Options) {
		o.MaxResources = 2
		o.Registerer = reg
	}).start()
	h.registered(res1, devices("a", 1))
	second := h.registered(res2, devices("b", 1))
	third := h.plugin(res3, devices("c", 1))

	h.requireOverLimit(third, res3, "serve 2 resources", "(MaxResources) is 2")
	assert.InDelta(t, 1, testutil.ToFloat64(h.m.metrics.refused.WithLabelValues("", reasonResources)), 0)
	_, err := reg.Gather()
	require.NoError(t, err)
	h.reregister(second) // a resource already served registers again

	// Gone, then removed after the grace period: its place is free.
	second.Stop()
	h.waitCapacity(res2, 1, 0)
	h.clock.Step(h.m.opts.StopGracePeriod + 1)
	h.eventually(func() bool { c, _ := h.capacity(res2); return c == -1 }, "res2 removed")
	h.register(third)
}

// A registration of one instance more than MaxInstancesPerResource is
// refused with ResourceExhausted; one again on a connected socket is not.
func TestMaxInstancesPerResource(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxInstancesPerResource = 2 }).start()
	onSocket := func(name string) func(*plugintest.Options) {
		return func(o *plugintest.Options) { o.Endpoint = name }
	}
	first := h.registered(res1, devices("d", 2), onSocket("a.sock"))
	h.registered(res1, devices("d", 2), onSocket("b.sock"))
	third := h.plugin(res1, devices("d", 2), onSocket("c.sock"))

	h.requireOverLimit(third, res1, third.SocketPath(), "2 instances are connected", "(MaxInstancesPerResource) is 2")
	assert.InDelta(t, 1, testutil.ToFloat64(h.m.metrics.refused.WithLabelValues(res1, reasonInstances)), 0)

	h.reregister(first) // the same socket again replaces its instance
	h.waitCapacity(res1, 2, 2)
}

// The limits hold for registrations that overlap: one whose dial-back
// began while there was room is refused if another took the room meanwhile.
func TestMaxResourcesCheckedAfterTheDial(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxResources = 1 }).start()
	slow := h.plugin(res1, devices("a", 1))
	release := slow.Block(plugintest.MethodGetDevicePluginOptions)
	refused := make(chan error, 1)
	go func() { refused <- slow.Register(h.kubeletSocket()) }()
	_, err := slow.WaitForCalls(h.waitCtx(), plugintest.MethodGetDevicePluginOptions, 1)
	require.NoError(t, err)

	h.registered(res2, devices("b", 2))
	release()
	err = <-refused
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, "(MaxResources) is 1")
	assert.Zero(t, slow.Streams(), "its connection was closed before any stream")
	assert.Equal(t, int64(-1), func() int64 { c, _ := h.capacity(res1); return c }())
	h.waitCapacity(res2, 2, 2)
}
