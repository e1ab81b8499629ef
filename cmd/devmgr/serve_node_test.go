package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/nodestatus"
)

func TestServeNodeFlagErrors(t *testing.T) {
	dir := shortTempDir(t)
	kubeconfig := writeKubeconfig(t, dir, "https://127.0.0.1:1")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--node-name", "n1"}, "--node-name needs --kubeconfig"},
		{[]string{"--register-node"}, "--register-node needs --kubeconfig"},
		{[]string{"--dra"}, "--dra needs --kubeconfig"},
		{[]string{"--kubeconfig", kubeconfig, "--node-name", "n1", "--dra", "--dra-driver", "Not_A_Domain"}, `--dra-driver "Not_A_Domain" is not a valid driver name`},
		{[]string{"--kubeconfig", kubeconfig}, "--kubeconfig needs --node-name"},
		{[]string{"--kubeconfig", kubeconfig, "--node-name", "Bad_Name"}, `--node-name "Bad_Name" is not a valid node name`},
		{[]string{"--kubeconfig", filepath.Join(dir, "missing"), "--node-name", "n1"}, "--kubeconfig: stat"},
		{[]string{"--kubeconfig", writeFile(t, dir, "garbage", "{not yaml"), "--node-name", "n1"}, "--kubeconfig " + filepath.Join(dir, "garbage")},
	} {
		fails(t, nil, append([]string{"serve", "--socket-dir", filepath.Join(dir, "dp"), "--control-socket", filepath.Join(dir, "c.sock")}, tc.args...), tc.want)
	}
}

// fakeAPIServer answers the requests a publisher makes about one node and
// records them.
type fakeAPIServer struct {
	mu       sync.Mutex
	created  bool
	requests []string // "METHOD path?query", without the timeout
	applied  []string // bodies of status patches
}

func (f *fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	q := r.URL.Query()
	q.Del("timeout") // the client's request timeout
	f.requests = append(f.requests, r.Method+" "+r.URL.Path+"?"+q.Encode())
	w.Header().Set("Content-Type", "application/json")
	const node = `{"kind":"Node","apiVersion":"v1","metadata":{"name":"edge-1"}}`
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/edge-1" && !f.created:
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/nodes":
		f.created = true
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, node)
	case r.Method == http.MethodPatch && r.URL.Path == "/api/v1/nodes/edge-1/status":
		f.applied = append(f.applied, string(body))
		_, _ = io.WriteString(w, node)
	default:
		_, _ = io.WriteString(w, node)
	}
}

func (f *fakeAPIServer) snapshot() (requests, applied []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...), append([]string(nil), f.applied...)
}

// serve --kubeconfig --node-name --register-node creates the node, applies
// the plugin's devices to its status as field manager devmgr, logs each
// publish and counts it on /metrics.
func TestServePublishesTheNodeStatus(t *testing.T) {
	api := &fakeAPIServer{}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	dir := shortTempDir(t)
	sockDir := filepath.Join(dir, "dp")
	started := time.Now()
	s := startServe(t, filepath.Join(dir, "ctl.sock"), "--socket-dir", sockDir, "--metrics-address", "127.0.0.1:0",
		"--kubeconfig", writeKubeconfig(t, dir, srv.URL), "--node-name", "edge-1", "--register-node")
	addr := regexp.MustCompile(`Serving metrics.*address="([^"]+)"`).FindStringSubmatch(s.log.String())
	require.Len(t, addr, 2, s.log.String())

	p := startPlugin(t, sockDir, gpus(2))
	published := func(want string) bool {
		_, applied := api.snapshot()
		return len(applied) > 0 && strings.Contains(applied[len(applied)-1], want)
	}
	require.True(t, eventually(10*time.Second, s.exited, func() bool { return published(`"allocatable":{"example.com/gpu":"2"}`) }), s.log.String())

	p.Update([]*pluginapi.Device{{ID: "gpu-0", Health: pluginapi.Healthy}, {ID: "gpu-1", Health: pluginapi.Unhealthy}})
	require.True(t, eventually(10*time.Second, s.exited, func() bool { return published(`"allocatable":{"example.com/gpu":"1"}`) }), s.log.String())

	requests, applied := api.snapshot()
	ran := time.Since(started)
	require.GreaterOrEqual(t, len(requests), 4)
	assert.Equal(t, []string{"GET /api/v1/nodes/edge-1?", "POST /api/v1/nodes?fieldManager=devmgr",
		"GET /api/v1/nodes/edge-1?", "PATCH /api/v1/nodes/edge-1/status?fieldManager=devmgr&force=true"}, requests[:4],
		"the node is looked up and created, looked up again for the reset, then its status applied")
	// Later reads are the publisher's checks, each at least a CheckInterval
	// after the last write or check: how many fit depends on how long the
	// run took, never more than it allows.
	checks := strings.Count(strings.Join(requests[4:], "\n"), "GET /api/v1/nodes/edge-1?")
	assert.LessOrEqual(t, checks, int(ran/nodestatus.DefaultCheckInterval), "the node is looked up again only to check it")
	assert.NotContains(t, requests[4:], "POST /api/v1/nodes?fieldManager=devmgr", "the node is created once")
	assert.Contains(t, applied[len(applied)-1], `"capacity":{"example.com/gpu":"2"}`)
	assert.Contains(t, s.log.String(), `"Registered node"`)
	assert.Contains(t, s.log.String(), `"Published device resources in the node status"`)
	metrics := scrape(t, addr[1])
	assert.Regexp(t, `devmgr_node_status_publishes_total\{result="success"\} [1-9]`, metrics)
	assert.Contains(t, metrics, "devmgr_node_status_last_publish_timestamp_seconds")
	assert.Equal(t, 0, s.stop(syscall.SIGTERM))
}

// writeKubeconfig writes a kubeconfig of server, with a token, into dir.
func writeKubeconfig(t *testing.T, dir, server string) string {
	t.Helper()
	return writeFile(t, dir, "kubeconfig", fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: secret}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, server))
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}
