package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/openkubelet/devmgr/plugintest"
)

// serve with the podresources API, metrics and the plugins registry: a plugin
// registers through the registry directory, a pod is admitted through the
// control socket, the podresources client lists exactly its devices, and
// /metrics carries the kubelet's metric names.
func TestServePodResourcesMetricsRegistry(t *testing.T) {
	dir := shortTempDir(t)
	sockDir := filepath.Join(dir, "dp")
	regDir := filepath.Join(dir, "reg")
	prSock := filepath.Join(dir, "pr", "kubelet.sock")
	s := startServe(t, filepath.Join(dir, "ctl.sock"), "--socket-dir", sockDir,
		"--podresources-socket", prSock, "--metrics-address", "127.0.0.1:0", "--plugins-registry-dir", regDir)
	s.waitLog("Serving metrics")
	addr := regexp.MustCompile(`Serving metrics.*address="([^"]+)"`).FindStringSubmatch(s.log.String())
	require.Len(t, addr, 2, s.log.String())

	pluginDir := filepath.Join(dir, "plug")
	require.NoError(t, os.MkdirAll(pluginDir, 0o750))
	p, err := plugintest.New(plugintest.Options{ResourceName: gpu, SocketDir: pluginDir, Devices: gpus(3)})
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	require.NoError(t, p.Start())
	require.NoError(t, p.ServeRegistry(regDir))
	// Another plugin registers the usual way, on kubelet.sock: both paths
	// work at the same time.
	nic, err := plugintest.New(plugintest.Options{ResourceName: "example.com/nic", SocketDir: sockDir, Devices: gpus(1)})
	require.NoError(t, err)
	t.Cleanup(nic.Stop)
	require.NoError(t, nic.Start())
	require.NoError(t, nic.Register(filepath.Join(sockDir, "kubelet.sock")))
	c := newAPIClient(t, s.ctl)
	c.waitStatus("the plugins' devices", func(st statusResponse) bool {
		r, n := st.resource(gpu), st.resource("example.com/nic")
		return r != nil && r.Allocatable == 3 && n != nil && n.Allocatable == 1
	})

	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"job","namespace":"ml","uid":"job-1"},
"spec":{"containers":[{"name":"main","resources":{"limits":{"example.com/gpu":"2"}}}]}}`
	res := ok(t, strings.NewReader(pod), "admit", "--control-socket", s.ctl, "-f", "-", "--json")
	require.Contains(t, res.stdout, `"uid": "job-1"`)

	client, ctx := podresourcesClient(t, prSock)
	list, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	require.NoError(t, err)
	require.Len(t, list.PodResources, 1)
	pr := list.PodResources[0]
	assert.Equal(t, []string{"job", "ml"}, []string{pr.Name, pr.Namespace})
	require.Len(t, pr.Containers, 1)
	var ids []string
	for _, d := range pr.Containers[0].Devices {
		assert.Equal(t, gpu, d.ResourceName)
		ids = append(ids, d.DeviceIds...)
	}
	sort.Strings(ids)
	assert.Equal(t, []string{"gpu-0", "gpu-1"}, ids)
	alloc, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	require.NoError(t, err)
	assert.Len(t, alloc.Devices, 4, "every healthy device, allocated or not")

	metrics := scrape(t, addr[1])
	assert.Contains(t, metrics, `kubelet_pod_resources_endpoint_requests_total{server_api_version="v1"} 2`)
	assert.Contains(t, metrics, `kubelet_pod_resources_endpoint_requests_list{server_api_version="v1"} 1`)
	assert.Contains(t, metrics, `kubelet_pod_resources_endpoint_requests_get_allocatable{server_api_version="v1"} 1`)
	assert.Contains(t, metrics, `kubelet_device_plugin_alloc_duration_seconds_count{resource_name="example.com/gpu"} 1`)
	// Counted for kubelet.sock registrations only, as the kubelet does.
	assert.Contains(t, metrics, `kubelet_device_plugin_registration_total{resource_name="example.com/nic"} 1`)
	assert.Contains(t, metrics, `devmgr_devices{health="healthy",resource_name="example.com/gpu"} 3`)
	assert.Contains(t, metrics, `devmgr_allocated_devices{resource_name="example.com/gpu"} 2`)

	p.StopRegistry() // the registry socket goes: the plugin is deregistered
	c.waitStatus("the plugin deregistered", func(st statusResponse) bool {
		r := st.resource(gpu)
		return r != nil && r.Allocatable == 0
	})
	assert.Equal(t, 0, s.stop(syscall.SIGTERM))
	assert.False(t, exists(prSock), "the podresources socket is removed")
}

// podresourcesClient dials the podresources socket sock; the connection
// and the context of its calls end with the test.
func podresourcesClient(t *testing.T, sock string) (podresourcesv1.PodResourcesListerClient, context.Context) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return podresourcesv1.NewPodResourcesListerClient(conn), ctx
}

// scrape returns the text of http://addr/metrics.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, resp.Body.Close())
	require.NoError(t, err)
	return string(body)
}

// The podresources rate limit is the kubelet's unless the flags change it;
// refused calls fail with ResourceExhausted and count in the metrics.
func TestServePodResourcesRateLimit(t *testing.T) {
	t.Run("the kubelet's limit by default", func(t *testing.T) {
		o := &extraOptions{}
		f := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		o.addFlags(f)
		require.NoError(t, f.Parse(nil))
		cfg, err := o.config(serveConfig{numaNodes: []int{0}})
		require.NoError(t, err)
		assert.InDelta(t, 100, cfg.podresourcesQPS, 0)
		assert.Equal(t, 10, cfg.podresourcesBurst)

		require.NoError(t, f.Parse([]string{"--podresources-qps", "-1", "--podresources-burst", "0"}))
		cfg, err = o.config(serveConfig{numaNodes: []int{0}})
		require.NoError(t, err)
		assert.Zero(t, cfg.podresourcesQPS, "no limit")
	})

	list := func(t *testing.T, sock string, n int) (refused int) {
		t.Helper()
		client, ctx := podresourcesClient(t, sock)
		for range n {
			_, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
			switch status.Code(err) {
			case codes.OK:
			case codes.ResourceExhausted:
				assert.Equal(t, "rejected by rate limit", status.Convert(err).Message())
				refused++
			default:
				require.NoError(t, err)
			}
		}
		return refused
	}
	for _, tc := range []struct {
		name     string
		flags    []string
		calls    int
		refused  int
		contains []string
	}{
		// One call an hour after a burst of two: the third call is refused
		// however fast or slow the machine.
		{"a limit set by flags", []string{"--podresources-qps", "0.0003", "--podresources-burst", "2"}, 3, 1, []string{
			`kubelet_pod_resources_endpoint_requests_total{server_api_version="v1"} 3`,
			`kubelet_pod_resources_endpoint_requests_list{server_api_version="v1"} 3`,
			`kubelet_pod_resources_endpoint_errors_list{server_api_version="v1"} 1`,
		}},
		{"no limit", []string{"--podresources-qps", "0"}, 30, 0, []string{
			`kubelet_pod_resources_endpoint_requests_total{server_api_version="v1"} 30`,
			`kubelet_pod_resources_endpoint_errors_list{server_api_version="v1"} 0`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := shortTempDir(t)
			prSock := filepath.Join(dir, "pr", "kubelet.sock")
			s := startServe(t, filepath.Join(dir, "ctl.sock"), append([]string{"--socket-dir", filepath.Join(dir, "dp"),
				"--numa-nodes", "0", "--podresources-socket", prSock, "--metrics-address", "127.0.0.1:0"}, tc.flags...)...)
			s.waitLog("Serving metrics")
			addr := regexp.MustCompile(`Serving metrics.*address="([^"]+)"`).FindStringSubmatch(s.log.String())
			require.Len(t, addr, 2, s.log.String())

			assert.Equal(t, tc.refused, list(t, prSock, tc.calls))
			metrics := scrape(t, addr[1])
			for _, want := range tc.contains {
				assert.Contains(t, metrics, want)
			}
			assert.Equal(t, 0, s.stop(syscall.SIGTERM))
		})
	}
}

func TestServeExtraFlagErrors(t *testing.T) {
	dir := shortTempDir(t)
	sockDir := filepath.Join(dir, "dp")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--podresources-socket", filepath.Join(sockDir, "pr.sock")}, "is in --socket-dir"},
		{[]string{"--podresources-socket", filepath.Join(dir, strings.Repeat("p", 120))}, "a unix socket path holds at most 107"},
		{[]string{"--metrics-address", "no-port"}, "--metrics-address"},
		{[]string{"--topology-policy", "strict"}, `--topology-policy: unknown policy "strict": want none, best-effort, restricted or single-numa-node`},
		{[]string{"--topology-scope", "node"}, `--topology-scope: unknown scope "node": want container or pod`},
		{[]string{"--podresources-burst", "0"}, "--podresources-burst must be at least 1 with a --podresources-qps limit, not 0"},
	} {
		fails(t, nil, append([]string{"serve", "--socket-dir", sockDir, "--control-socket", filepath.Join(dir, "c.sock")}, tc.args...), tc.want)
	}
}

// Shell completion offers the names --topology-policy, --topology-scope and
// --log-format take (cobra's __complete is what the completion scripts run).
func TestServeFlagCompletion(t *testing.T) {
	for flag, want := range map[string][]string{
		"--topology-policy": {"none", "best-effort", "restricted", "single-numa-node"},
		"--topology-scope":  {"container", "pod"},
		"--log-format":      {"text", "json"},
	} {
		res := devmgr(t, "", cobra.ShellCompRequestCmd, "serve", flag, "")
		require.Equal(t, exitOK, res.code, res.stderr)
		lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
		directive := fmt.Sprintf(":%d", cobra.ShellCompDirectiveNoFileComp)
		assert.Equal(t, append(slices.Clone(want), directive), lines, flag)
	}
}

// --topology-policy aligns allocations to one NUMA node, and refuses what
// single-numa-node cannot place, with the kubelet's reason.
func TestServeTopologyPolicy(t *testing.T) {
	devs := []*pluginapi.Device{
		{ID: "a0", Health: pluginapi.Healthy, Topology: numa(0)}, {ID: "a1", Health: pluginapi.Healthy, Topology: numa(0)},
		{ID: "b0", Health: pluginapi.Healthy, Topology: numa(1)}, {ID: "b1", Health: pluginapi.Healthy, Topology: numa(1)},
	}
	for _, tc := range []struct {
		policy   string
		want3    bool // a pod asking for 3 devices is admitted
		sameNode bool // a pod asking for 2 gets them on one node
	}{
		{"none", true, false},
		{"best-effort", true, true},
		// Two nodes are the narrowest any 3 devices fit in, so {0,1} is a
		// preferred hint and restricted admits (the kubelet's semantics).
		{"restricted", true, true},
		{"single-numa-node", false, true},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			dir := shortTempDir(t)
			sockDir := filepath.Join(dir, "dp")
			s := startServe(t, filepath.Join(dir, "ctl.sock"), "--socket-dir", sockDir,
				"--numa-nodes", "0,1", "--topology-policy", tc.policy)
			// Take b0 first, so that without alignment the next pod straddles.
			startPlugin(t, sockDir, devs)
			c := newAPIClient(t, s.ctl)
			c.waitStatus("devices", func(st statusResponse) bool { r := st.resource(gpu); return r != nil && r.Allocatable == 4 })
			first := ok(t, strings.NewReader(gpuPod("p1", 1)), "admit", "--control-socket", s.ctl, "-f", "-", "--json")
			require.Contains(t, first.stdout, `"a0"`)
			second := ok(t, strings.NewReader(gpuPod("p2", 2)), "admit", "--control-socket", s.ctl, "-f", "-", "--json")
			if tc.sameNode {
				assert.Contains(t, second.stdout, `"b0"`)
				assert.Contains(t, second.stdout, `"b1"`)
			}
			ok(t, nil, "release", "--control-socket", s.ctl, "p2")
			res := run(t, strings.NewReader(gpuPod("p3", 3)), "admit", "--control-socket", s.ctl, "-f", "-", "--json")
			if tc.want3 {
				assert.Equal(t, 0, res.code, res.stdout+res.stderr)
			} else {
				assert.NotEqual(t, 0, res.code)
				assert.Contains(t, res.stdout, "Resources cannot be allocated with Topology locality")
				assert.Contains(t, res.stdout, `"reason": "TopologyAffinityError"`)
			}
		})
	}
}

// --topology-scope pod aligns all of a pod's containers to one affinity,
// from their requests together: under single-numa-node a pod whose two
// containers ask for 2 and 1 devices is refused on two nodes of two devices
// each, where the container scope places each container on a node of its
// own; a pod of 1 and 1 gets both devices on one node.
func TestServeTopologyScope(t *testing.T) {
	devs := []*pluginapi.Device{
		{ID: "a0", Health: pluginapi.Healthy, Topology: numa(0)}, {ID: "a1", Health: pluginapi.Healthy, Topology: numa(0)},
		{ID: "b0", Health: pluginapi.Healthy, Topology: numa(1)}, {ID: "b1", Health: pluginapi.Healthy, Topology: numa(1)},
	}
	twoContainers := func(uid string, x, y int) string {
		limits := func(n int) string { return `{"limits":{"example.com/gpu":"` + strconv.Itoa(n) + `"}}` }
		return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + uid + `","uid":"` + uid + `"},
"spec":{"containers":[{"name":"x","resources":` + limits(x) + `},{"name":"y","resources":` + limits(y) + `}]}}`
	}
	for _, scope := range []string{"container", "pod"} {
		t.Run(scope, func(t *testing.T) {
			dir := shortTempDir(t)
			sockDir := filepath.Join(dir, "dp")
			s := startServe(t, filepath.Join(dir, "ctl.sock"), "--socket-dir", sockDir,
				"--numa-nodes", "0,1", "--topology-policy", "single-numa-node", "--topology-scope", scope)
			startPlugin(t, sockDir, devs)
			c := newAPIClient(t, s.ctl)
			c.waitStatus("devices", func(st statusResponse) bool { r := st.resource(gpu); return r != nil && r.Allocatable == 4 })

			res := run(t, strings.NewReader(twoContainers("p1", 2, 1)), "admit", "--control-socket", s.ctl, "-f", "-", "--json")
			if scope == "container" {
				require.Equal(t, 0, res.code, res.stdout+res.stderr)
				ok(t, nil, "release", "--control-socket", s.ctl, "p1")
			} else {
				assert.NotEqual(t, 0, res.code)
				assert.Contains(t, res.stdout, `"error": "Resources cannot be allocated with Topology locality"`)
				assert.Contains(t, res.stdout, `"reason": "TopologyAffinityError"`)
			}

			// One device taken on node 0 first: in the pod scope the pod of
			// 1 and 1 goes to node 1 whole.
			ok(t, strings.NewReader(gpuPod("p2", 1)), "admit", "--control-socket", s.ctl, "-f", "-", "--json")
			pair := ok(t, strings.NewReader(twoContainers("p3", 1, 1)), "admit", "--control-socket", s.ctl, "-f", "-", "--json")
			if scope == "pod" {
				assert.Contains(t, pair.stdout, `"b0"`)
				assert.Contains(t, pair.stdout, `"b1"`)
			}
		})
	}
}

func numa(n int64) *pluginapi.TopologyInfo {
	return &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: n}}}
}

func gpuPod(uid string, gpus int) string {
	return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + uid + `","uid":"` + uid + `"},
"spec":{"containers":[{"name":"main","resources":{"limits":{"example.com/gpu":"` + strconv.Itoa(gpus) + `"}}}]}}`
}

// /healthz answers ok while the metrics server serves; /readyz only while
// the control socket serves and the manager's registration server does.
func TestMetricsProbes(t *testing.T) {
	h := newControlHarness(t, gpus(1))
	ready := &readiness{health: h.mgr.HealthCheck}
	srv := httptest.NewServer(metricsHandler(prometheus.NewRegistry(), ready.check))
	t.Cleanup(srv.Close)
	probe := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, resp.Body.Close())
		require.NoError(t, err)
		assert.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"), path)
		return resp.StatusCode, string(body)
	}
	type answer struct {
		code int
		body string
	}
	check := func(path string, want answer) {
		t.Helper()
		code, body := probe(path)
		assert.Equal(t, want, answer{code, body}, path)
	}

	check("/healthz", answer{http.StatusOK, "ok\n"})
	check("/readyz", answer{http.StatusServiceUnavailable, "not ready: the control socket is not serving\n"})
	ready.serving.Store(true)
	check("/readyz", answer{http.StatusOK, "ok\n"})
	h.mgr.Stop()
	check("/readyz", answer{http.StatusServiceUnavailable, "not ready: device manager is stopped\n"})
	check("/healthz", answer{http.StatusOK, "ok\n"})

	resp, err := http.Post(srv.URL+"/readyz", "text/plain", nil)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

// serve --metrics-address answers the probes: ready once it serves, not
// ready as soon as it shuts down, while it still drains a request.
func TestServeProbes(t *testing.T) {
	dir := shortTempDir(t)
	s := startServe(t, filepath.Join(dir, "ctl.sock"), "--socket-dir", filepath.Join(dir, "dp"), "--numa-nodes", "0",
		"--metrics-address", "127.0.0.1:0")
	s.waitLog("Serving metrics")
	addr := regexp.MustCompile(`Serving metrics.*address="([^"]+)"`).FindStringSubmatch(s.log.String())
	require.Len(t, addr, 2, s.log.String())
	probe := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr[1] + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, body := probe("/healthz")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "ok\n", body)
	code, body = probe("/readyz")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "ok\n", body)

	// A request whose body never comes holds shutdown in its drain. The
	// server's "100 Continue" says that its handler reads the body: the
	// request is in hand, not waiting in the listener's queue.
	conn, err := net.Dial("unix", s.ctl)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = io.WriteString(conn, "POST /v1/pods HTTP/1.1\r\nHost: devmgr\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	line, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 100 Continue\r\n", line)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	s.waitLog("Shutting down")
	var last string
	notReady := eventually(5*time.Second, s.exited, func() bool {
		code, body := probe("/readyz")
		last = fmt.Sprint(code, " ", body)
		return code == http.StatusServiceUnavailable
	})
	require.True(t, notReady, "readyz while shutting down: %s", last)
	assert.Equal(t, "503 not ready: the control socket is not serving\n", last)
	code, body = probe("/healthz")
	assert.Equal(t, http.StatusOK, code, "the process still serves: %s", body)
	require.NoError(t, conn.Close())
	assert.Equal(t, 0, s.wait(10*time.Second))
}
