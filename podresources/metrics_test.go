package podresources_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/openkubelet/devmgr/podresources"
)

// allMetrics are the server's metric names, as the kubelet names them.
var allMetrics = []string{
	podresources.MetricRequestsTotal,
	podresources.MetricRequestsList, podresources.MetricErrorsList,
	podresources.MetricRequestsGetAllocatable, podresources.MetricErrorsGetAllocatable,
	podresources.MetricRequestsGet, podresources.MetricErrorsGet,
}

// wantMetrics is the exposition of the server's counters with the kubelet's
// help texts, for the given values in allMetrics order.
func wantMetrics(values ...int) string {
	help := []string{
		"Cumulative number of requests to the PodResource endpoint.",
		"Number of requests to the PodResource List endpoint.",
		"Number of requests to the PodResource List endpoint which returned error.",
		"Number of requests to the PodResource GetAllocatableResources endpoint.",
		"Number of requests to the PodResource GetAllocatableResources endpoint which returned error.",
		"Number of requests to the PodResource Get endpoint.",
		"Number of requests to the PodResource Get endpoint which returned error.",
	}
	var b strings.Builder
	for i, name := range allMetrics {
		fmt.Fprintf(&b, "# HELP %s %s Broken down by server api version.\n# TYPE %s counter\n%s{server_api_version=\"v1\"} %d\n",
			name, help[i], name, name, values[i])
	}
	return b.String()
}

func TestMetrics(t *testing.T) {
	t.Run("every call counts as a request of its method; failures as errors", func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		srv := newServer(t, fakeDevices{}, podresources.Options{Registerer: reg})
		path := filepath.Join(shortDir(t), "s.sock")
		require.NoError(t, srv.Start(path))
		client, ctx := dial(t, path), callCtx(t)

		for range 2 {
			_, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
			require.NoError(t, err)
		}
		_, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
		require.NoError(t, err)
		_, err = client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodName: "nope", PodNamespace: "default"})
		require.Equal(t, codes.NotFound, status.Code(err))

		// total, list, list errors, allocatable, its errors, get, get errors
		assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(wantMetrics(4, 2, 0, 1, 0, 1, 1)), allMetrics...))
	})

	t.Run("a burst over the rate limit is refused and counted", func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		// Three calls at once, and one more an hour later: the test's calls
		// beyond three are refused whatever the speed of the machine.
		lim := rate.NewLimiter(rate.Every(time.Hour), 3)
		srv := newServer(t, fakeDevices{}, podresources.Options{Registerer: reg, Limiter: lim})
		path := filepath.Join(shortDir(t), "s.sock")
		require.NoError(t, srv.Start(path))
		client, ctx := dial(t, path), callCtx(t)

		var refused int
		for i := range 5 {
			_, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
			if i < 3 {
				require.NoError(t, err, "call %d is within the burst", i)
				continue
			}
			assert.Equal(t, codes.ResourceExhausted, status.Code(err), "call %d", i)
			assert.Equal(t, "rejected by rate limit", status.Convert(err).Message())
			refused++
		}
		_, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
		assert.Equal(t, codes.ResourceExhausted, status.Code(err))
		_, err = client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{})
		assert.Equal(t, codes.ResourceExhausted, status.Code(err))
		require.Equal(t, 2, refused)

		assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(wantMetrics(7, 5, 2, 1, 1, 1, 1)), allMetrics...))
	})

	t.Run("a second server on the same registerer fails and registers nothing", func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		newServer(t, fakeDevices{}, podresources.Options{Registerer: reg})
		srv, err := podresources.NewServer(fakeDevices{}, noPods, podresources.Options{Registerer: reg})
		require.ErrorContains(t, err, "podresources: register metrics")
		assert.Nil(t, srv)

		other := prometheus.NewPedanticRegistry()
		require.NoError(t, other.Register(prometheus.NewCounter(prometheus.CounterOpts{Name: podresources.MetricErrorsGet, Help: "taken"})))
		_, err = podresources.NewServer(fakeDevices{}, noPods, podresources.Options{Registerer: other})
		require.Error(t, err)
		n, err := testutil.GatherAndCount(other)
		require.NoError(t, err)
		assert.Equal(t, 1, n, "none of the server's counters is registered")
	})
}
