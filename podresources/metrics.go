package podresources

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names: the kubelet's, with its label and help texts, so that
// dashboards and alerts built for the kubelet's podresources endpoint keep
// working. Each has one label, server_api_version, always "v1" here.
const (
	MetricRequestsTotal          = "kubelet_pod_resources_endpoint_requests_total"
	MetricRequestsList           = "kubelet_pod_resources_endpoint_requests_list"
	MetricRequestsGetAllocatable = "kubelet_pod_resources_endpoint_requests_get_allocatable"
	MetricRequestsGet            = "kubelet_pod_resources_endpoint_requests_get"
	MetricErrorsList             = "kubelet_pod_resources_endpoint_errors_list"
	MetricErrorsGetAllocatable   = "kubelet_pod_resources_endpoint_errors_get_allocatable"
	MetricErrorsGet              = "kubelet_pod_resources_endpoint_errors_get"
)

// method is one RPC of the service and its two counters.
type method struct {
	name     string
	requests prometheus.Counter
	errors   prometheus.Counter
}

// metrics holds the server's counters. With no Registerer they exist but are
// registered nowhere, so the code that counts needs no checks.
type metrics struct {
	total                  prometheus.Counter
	list, allocatable, get method
}

// counterVecs registers as one collector: a Registry registers all of them
// or, on a clash, none.
type counterVecs []*prometheus.CounterVec

func (c counterVecs) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c {
		v.Describe(ch)
	}
}

func (c counterVecs) Collect(ch chan<- prometheus.Metric) {
	for _, v := range c {
		v.Collect(ch)
	}
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	var vecs counterVecs
	counter := func(name, help string) prometheus.Counter {
		vec := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: name,
			Help: help + " Broken down by server api version.",
		}, []string{"server_api_version"})
		vecs = append(vecs, vec)
		return vec.WithLabelValues("v1")
	}
	newMethod := func(name, requests, errors string) method {
		return method{
			name:     name,
			requests: counter(requests, "Number of requests to the PodResource "+name+" endpoint."),
			errors:   counter(errors, "Number of requests to the PodResource "+name+" endpoint which returned error."),
		}
	}
	m := &metrics{
		total:       counter(MetricRequestsTotal, "Cumulative number of requests to the PodResource endpoint."),
		list:        newMethod("List", MetricRequestsList, MetricErrorsList),
		allocatable: newMethod("GetAllocatableResources", MetricRequestsGetAllocatable, MetricErrorsGetAllocatable),
		get:         newMethod("Get", MetricRequestsGet, MetricErrorsGet),
	}
	if reg != nil {
		if err := reg.Register(vecs); err != nil {
			return nil, err
		}
	}
	return m, nil
}
