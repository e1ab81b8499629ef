package devicemanager

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/plugintest"
)

// A scripted run, then the metrics read back by name, label and value.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	h := newHarness(t, func(o *Options) { o.Registerer = reg }).start()
	gpu := h.registered(res1, devices("g", 3), func(o *plugintest.Options) {
		o.Endpoint = "gpu.sock"
		o.PreStartRequired = true
		o.GetPreferredAllocationAvailable = true
	})
	nic := h.registered(res2, devices("n", 2), func(o *plugintest.Options) { o.Endpoint = "nic.sock" })
	bad := nic.RegisterRequest()
	bad.Version = "v0"
	require.Error(t, nic.RegisterWith(context.Background(), h.kubeletSocket(), bad), "refused, but counted")

	pod := newPod("p1", ctr("app", res1, 2, res2, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	_, err := h.m.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
	require.NoError(t, err)

	nic.SetError(plugintest.MethodAllocate, status.Error(codes.Internal, "boom"))
	failing := newPod("p2", ctr("app", res2, 1))
	h.pods.add(failing)
	require.Error(t, h.admit(failing))

	gpu.Update([]*pluginapi.Device{dev("g0", pluginapi.Healthy), dev("g1", pluginapi.Healthy), dev("g2", pluginapi.Unhealthy)})
	h.waitCapacity(res1, 3, 2)

	assert.InDelta(t, 1, testutil.ToFloat64(h.m.metrics.registrations.WithLabelValues(res1)), 0)
	assert.InDelta(t, 2, testutil.ToFloat64(h.m.metrics.registrations.WithLabelValues(res2)), 0, "refused registrations count too")
	assert.Equal(t, 2, testutil.CollectAndCount(h.m.metrics.allocDuration), "one series per resource")
	assert.InDelta(t, 1, testutil.ToFloat64(h.m.metrics.rpcErrors.WithLabelValues(res2, methodAllocate)), 0)
	assert.Equal(t, 1, testutil.CollectAndCount(h.m.metrics.rpcErrors))
	assert.Equal(t, 1, testutil.CollectAndCount(h.m.metrics.preStart))
	assert.Equal(t, 1, testutil.CollectAndCount(h.m.metrics.preferred))
	assert.Equal(t, 2, testutil.CollectAndCount(h.m.metrics.messageBytes))
	h.eventually(func() bool {
		n, size := h.listSizes(res2)
		return n == 1 && size == float64(proto.Size(&pluginapi.ListAndWatchResponse{Devices: devices("n", 2)}))
	}, "the size of %s's one list in the message size histogram", res2)

	// The update's checkpoint write ends after the capacity shows it: the
	// metric is the size of the file once both are done.
	h.eventually(func() bool {
		blob, err := os.ReadFile(filepath.Join(h.dir, checkpoint.DeviceManagerKey))
		return err == nil && float64(len(blob)) == testutil.ToFloat64(h.m.metrics.checkpointBytes) &&
			slices.Equal(checkpointHealthy(h, res1), []string{"g0", "g1"})
	}, "the checkpoint size metric is the file's size")
	assert.Positive(t, testutil.ToFloat64(h.m.metrics.checkpointTotal.WithLabelValues("written")))

	// The whole exposition, as a scrape sees it.
	want := `
# HELP devmgr_allocated_devices Devices allocated to containers or reserved for an allocation in flight. Broken down by resource name.
# TYPE devmgr_allocated_devices gauge
devmgr_allocated_devices{resource_name="domain1.com/resource1"} 2
devmgr_allocated_devices{resource_name="domain2.com/resource2"} 1
# HELP devmgr_devices Devices advertised by device plugins. Broken down by resource name and health (healthy, unhealthy).
# TYPE devmgr_devices gauge
devmgr_devices{health="healthy",resource_name="domain1.com/resource1"} 2
devmgr_devices{health="healthy",resource_name="domain2.com/resource2"} 2
devmgr_devices{health="unhealthy",resource_name="domain1.com/resource1"} 1
devmgr_devices{health="unhealthy",resource_name="domain2.com/resource2"} 0
# HELP kubelet_device_plugin_registration_total Cumulative number of device plugin registrations. Broken down by resource name.
# TYPE kubelet_device_plugin_registration_total counter
kubelet_device_plugin_registration_total{resource_name="domain1.com/resource1"} 1
kubelet_device_plugin_registration_total{resource_name="domain2.com/resource2"} 2
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		MetricRegistrationTotal, MetricDevices, MetricAllocatedDevices))
	n, err := testutil.GatherAndCount(reg, MetricAllocDuration)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
}

func TestMetricsRegisteredOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	_, err := NewManagerImpl(Options{SocketDir: dir, Registerer: reg})
	require.NoError(t, err)
	_, err = NewManagerImpl(Options{SocketDir: dir, Registerer: reg})
	var already prometheus.AlreadyRegisteredError
	assert.ErrorAs(t, err, &already, "a second manager on the same registry is refused")
}

// Register requests are counted under their name only when it names a
// resource the manager holds: ever new invalid or unknown names add no
// series.
func TestRegistrationCounterSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	h := newHarness(t, func(o *Options) { o.Registerer = reg }).start()
	p := h.registered(res1, devices("d", 1))
	ctx := h.waitCtx()
	for _, name := range []string{"bad name", "no-domain", "kubernetes.io/gpu", "", "requests.x/y"} {
		req := p.RegisterRequest()
		req.ResourceName = name
		require.Error(t, p.RegisterWith(ctx, h.kubeletSocket(), req))
	}
	for _, name := range []string{"example.com/a", "example.com/b"} {
		req := p.RegisterRequest()
		req.ResourceName, req.Endpoint = name, "missing.sock"
		require.Error(t, p.RegisterWith(ctx, h.kubeletSocket(), req))
	}
	bad := p.RegisterRequest()
	bad.Version = "v0"
	require.Error(t, p.RegisterWith(ctx, h.kubeletSocket(), bad))

	assert.Equal(t, 3, testutil.CollectAndCount(h.m.metrics.registrations, MetricRegistrationTotal))
	assert.InDelta(t, 2, testutil.ToFloat64(h.m.metrics.registrations.WithLabelValues(res1)), 0)
	assert.InDelta(t, 5, testutil.ToFloat64(h.m.metrics.registrations.WithLabelValues(registrationInvalid)), 0)
	assert.InDelta(t, 2, testutil.ToFloat64(h.m.metrics.registrations.WithLabelValues(registrationUnknown)), 0)
}
