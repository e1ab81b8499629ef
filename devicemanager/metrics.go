package devicemanager

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names. The first two are the kubelet's (same names, labels, help and
// buckets), so dashboards built for the kubelet keep working; the others are
// devmgr's additions, for what operators asked the kubelet for (upstream
// #94139, #68650).
const (
	MetricRegistrationTotal        = "kubelet_device_plugin_registration_total"
	MetricAllocDuration            = "kubelet_device_plugin_alloc_duration_seconds"
	MetricRPCErrorsTotal           = "devmgr_device_plugin_rpc_errors_total"
	MetricPreStartDuration         = "devmgr_device_plugin_prestart_duration_seconds"
	MetricPreferredAllocDuration   = "devmgr_device_plugin_preferred_allocation_duration_seconds"
	MetricListAndWatchMessageBytes = "devmgr_device_plugin_list_and_watch_message_bytes"
	MetricDevices                  = "devmgr_devices"
	MetricAllocatedDevices         = "devmgr_allocated_devices"
	MetricCheckpointWriteDuration  = "devmgr_checkpoint_write_duration_seconds"
	MetricCheckpointBytes          = "devmgr_checkpoint_bytes"
	MetricCheckpointWritesTotal    = "devmgr_checkpoint_writes_total"
	MetricPluginInputRefusedTotal  = "devmgr_device_plugin_input_refused_total"
)

// Label values of MetricRegistrationTotal for requests not counted under
// their resource name. Neither is a valid resource name (no '/'), so neither
// can stand for a resource.
const (
	// registrationInvalid: the name is not a valid extended resource name.
	registrationInvalid = "invalid"
	// registrationUnknown: a valid name of no resource the manager holds,
	// whose registration failed or was refused.
	registrationUnknown = "unknown"
)

// Reasons of MetricPluginInputRefusedTotal: the limit a plugin went over.
const (
	reasonResources = "resources" // MaxResources; resource_name is empty
	reasonInstances = "instances" // MaxInstancesPerResource
	reasonDevices   = "devices"   // MaxDevicesPerResource
)

// RPC method labels of MetricRPCErrorsTotal.
const (
	methodAllocate               = "Allocate"
	methodPreStartContainer      = "PreStartContainer"
	methodGetPreferredAllocation = "GetPreferredAllocation"
	methodListAndWatch           = "ListAndWatch"
	methodGetDevicePluginOptions = "GetDevicePluginOptions"
)

// metrics holds the manager's instruments. With no Registerer they exist but
// are registered nowhere, so the code that updates them needs no checks.
type metrics struct {
	registrations   *prometheus.CounterVec
	allocDuration   *prometheus.HistogramVec
	rpcErrors       *prometheus.CounterVec
	preStart        *prometheus.HistogramVec
	preferred       *prometheus.HistogramVec
	messageBytes    *prometheus.HistogramVec
	checkpointWrite prometheus.Histogram
	checkpointBytes prometheus.Gauge
	checkpointTotal *prometheus.CounterVec
	refused         *prometheus.CounterVec
}

func newMetrics(m *ManagerImpl, reg prometheus.Registerer) (*metrics, error) {
	mt := &metrics{
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricRegistrationTotal,
			Help: "Cumulative number of device plugin registrations. Broken down by resource name.",
		}, []string{"resource_name"}),
		allocDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricAllocDuration,
			Help:    "Duration in seconds to serve a device plugin Allocation request. Broken down by resource name.",
			Buckets: prometheus.DefBuckets,
		}, []string{"resource_name"}),
		rpcErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricRPCErrorsTotal,
			Help: "Device plugin RPCs that failed or timed out. Broken down by resource name and method.",
		}, []string{"resource_name", "method"}),
		preStart: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricPreStartDuration,
			Help:    "Duration in seconds of device plugin PreStartContainer calls. Broken down by resource name.",
			Buckets: prometheus.DefBuckets,
		}, []string{"resource_name"}),
		preferred: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricPreferredAllocDuration,
			Help:    "Duration in seconds of device plugin GetPreferredAllocation calls. Broken down by resource name.",
			Buckets: prometheus.DefBuckets,
		}, []string{"resource_name"}),
		messageBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricListAndWatchMessageBytes,
			Help:    "Size in bytes of ListAndWatch messages received from device plugins. Broken down by resource name.",
			Buckets: prometheus.ExponentialBuckets(256, 4, 10), // 256 B .. 64 MiB
		}, []string{"resource_name"}),
		checkpointWrite: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    MetricCheckpointWriteDuration,
			Help:    "Duration in seconds of durable checkpoint writes (encode, write, fsync, rename, directory fsync).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5 ms .. 4 s
		}),
		checkpointBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricCheckpointBytes,
			Help: "Size in bytes of the checkpoint last written.",
		}),
		checkpointTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricCheckpointWritesTotal,
			Help: "Checkpoint writes by result: written, unchanged (skipped: same bytes as on disk), failed.",
		}, []string{"result"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricPluginInputRefusedTotal,
			Help: "Device plugin registrations refused and instances disconnected for going over a limit. " +
				"Broken down by resource name (empty for reason resources) and reason (resources, instances, devices).",
		}, []string{"resource_name", "reason"}),
	}
	if reg == nil {
		return mt, nil
	}
	collectors := []prometheus.Collector{
		mt.registrations, mt.allocDuration, mt.rpcErrors, mt.preStart, mt.preferred, mt.messageBytes,
		mt.checkpointWrite, mt.checkpointBytes, mt.checkpointTotal, mt.refused, deviceCollector{m: m},
	}
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range collectors[:i] {
				reg.Unregister(done)
			}
			return nil, err
		}
	}
	return mt, nil
}

var (
	devicesDesc = prometheus.NewDesc(MetricDevices,
		"Devices advertised by device plugins. Broken down by resource name and health (healthy, unhealthy).",
		[]string{"resource_name", "health"}, nil)
	allocatedDesc = prometheus.NewDesc(MetricAllocatedDevices,
		"Devices allocated to containers or reserved for an allocation in flight. Broken down by resource name.",
		[]string{"resource_name"}, nil)
)

// deviceCollector reports device counts from the manager's state at scrape
// time, so they can never drift from it.
type deviceCollector struct{ m *ManagerImpl }

func (deviceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- devicesDesc
	ch <- allocatedDesc
}

func (c deviceCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, r := range m.core.resources {
		if !r.registered {
			continue
		}
		ch <- prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(r.healthyLen()), name, "healthy")
		ch <- prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(r.capacityLen()-r.healthyLen()), name, "unhealthy")
	}
	for _, name := range m.core.ledger.AllocatedResources() {
		ch <- prometheus.MustNewConstMetric(allocatedDesc, prometheus.GaugeValue, float64(m.core.ledger.AllocatedCount(name)), name)
	}
}
