package nodestatus

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names.
const (
	MetricPublishesTotal    = "devmgr_node_status_publishes_total"
	MetricLastPublishSecond = "devmgr_node_status_last_publish_timestamp_seconds"
)

// Results, the label values of MetricPublishesTotal.
const (
	resultSuccess = "success"
	resultFailure = "failure"
)

// Metrics are a Publisher's instruments. A nil *Metrics records nothing.
type Metrics struct {
	publishes *prometheus.CounterVec
	last      prometheus.Gauge
}

// NewMetrics returns the publisher's metrics registered with reg (none
// when reg is nil), or the error of a name registered twice.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricPublishesTotal,
			Help: "Writes of the device resources to the node status, by result: success or failure.",
		}, []string{"result"}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricLastPublishSecond,
			Help: "Start of the last successful write of the device resources to the node status, in seconds since the epoch.",
		}),
	}
	// Both results are exported from the start, at zero.
	m.publishes.WithLabelValues(resultSuccess)
	m.publishes.WithLabelValues(resultFailure)
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.publishes, m.last} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observe counts one publish; at is the time of a success.
func (m *Metrics) observe(result string, at time.Time) {
	if m == nil {
		return
	}
	m.publishes.WithLabelValues(result).Inc()
	if result == resultSuccess {
		m.last.Set(float64(at.UnixNano()) / 1e9)
	}
}
