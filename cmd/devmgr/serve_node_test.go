package main

import (
	"errors"
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

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/validation"
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
		{[]string{"--node-name", "n1"}, "--node-name needs --kubeconfig or $KUBECONFIG"},
		{[]string{"--register-node"}, "--register-node needs --kubeconfig or $KUBECONFIG"},
		{[]string{"--dra"}, "--dra needs --kubeconfig or $KUBECONFIG"},
		{[]string{"--kubeconfig", kubeconfig, "--node-name", "n1", "--dra", "--dra-driver", "Not_A_Domain"}, `--dra-driver "Not_A_Domain" is not a valid driver name`},
		{[]string{"--kubeconfig", kubeconfig, "--node-name", "Bad_Name"}, `--node-name "Bad_Name" is not a valid node name`},
		{[]string{"--kubeconfig", kubeconfig, "--node-name", "n1", "--dra-device-classes"}, "--dra-driver, --dra-device-classes, --dra-registry-dir, --dra-plugin-dir, --cdi-dir need --dra"},
		{[]string{"--cdi-dir", dir}, "need --dra"},
		{[]string{"--kubeconfig", kubeconfig, "--node-name", "n1", "--dra", "--dra-device-classes"}, "--dra-device-classes needs --no-node-status"},
		{[]string{"--kubeconfig", kubeconfig, "--node-name", "n1", "--register-node", "--no-node-status"}, "--register-node needs the Node status"},
		{[]string{"--kubeconfig", filepath.Join(dir, "missing"), "--node-name", "n1"}, "--kubeconfig: stat"},
		{[]string{"--kubeconfig", writeFile(t, dir, "garbage", "{not yaml"), "--node-name", "n1"}, "--kubeconfig " + filepath.Join(dir, "garbage")},
	} {
		fails(t, nil, append([]string{"serve", "--socket-dir", filepath.Join(dir, "dp"), "--control-socket", filepath.Join(dir, "c.sock")}, tc.args...), tc.want)
	}
}

// fakeAPIServer answers the requests a publisher makes about one node, node
// or else edge-1, and records them.
type fakeAPIServer struct {
	node     string
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
	name := f.node
	if name == "" {
		name = "edge-1"
	}
	node := `{"kind":"Node","apiVersion":"v1","metadata":{"name":"` + name + `"}}`
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/"+name && !f.created:
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/nodes":
		f.created = true
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, node)
	case r.Method == http.MethodPatch && r.URL.Path == "/api/v1/nodes/"+name+"/status":
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

// --kubeconfig defaults to $KUBECONFIG, a list of files as kubectl reads
// it, and --node-name to the host name lower-cased; --kubeconfig= publishes
// nothing, and both names are checked wherever they come from.
func TestServeNodeDefaults(t *testing.T) {
	dir := shortTempDir(t)
	kubeconfig := writeKubeconfig(t, dir, "https://127.0.0.1:1")
	missing := filepath.Join(dir, "missing")
	env := func(kubeconfig string) func(string) string {
		return func(key string) string {
			if key == envKubeconfig {
				return kubeconfig
			}
			return ""
		}
	}
	host := func(name string) func() (string, error) { return func() (string, error) { return name, nil } }
	// options parses args as serve does, with getenv as its environment and
	// hostname as the host name.
	options := func(t *testing.T, getenv func(string) string, hostname func() (string, error), args ...string) *nodeOptions {
		t.Helper()
		o := &nodeOptions{hostname: hostname}
		f := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		o.addFlags(f)
		require.NoError(t, f.Parse(args))
		o.fromEnvironment(f, getenv)
		return o
	}

	for _, tc := range []struct {
		name     string
		getenv   func(string) string
		hostname string
		args     []string
		node     string // "": nothing published
		source   string
	}{
		{"both defaults", env(kubeconfig), " Edge-1.Example.COM\n", nil, "edge-1.example.com", "$KUBECONFIG=" + kubeconfig},
		{"a list of files, one missing", env(missing + ":" + kubeconfig), "edge-1", nil, "edge-1", "$KUBECONFIG=" + missing + ":" + kubeconfig},
		{"the flags win", env(missing), "edge-1", []string{"--kubeconfig", kubeconfig, "--node-name", "n1"}, "n1", "--kubeconfig " + kubeconfig},
		{"--kubeconfig= publishes nothing", env(kubeconfig), "edge-1", []string{"--kubeconfig="}, "", ""},
		{"no kubeconfig at all", env(""), "edge-1", nil, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := options(t, tc.getenv, host(tc.hostname), tc.args...).config()
			require.NoError(t, err)
			assert.Equal(t, tc.node, cfg.nodeName)
			assert.Equal(t, tc.source, cfg.kubeconfigSource)
			assert.Equal(t, tc.node != "", cfg.client != nil, "published")
		})
	}

	for _, tc := range []struct {
		name     string
		getenv   func(string) string
		hostname func() (string, error)
		args     []string
		want     string
		code     int
	}{
		{"no file of $KUBECONFIG", env(missing), host("edge-1"), nil,
			"$KUBECONFIG=" + missing + ": no such file; set --kubeconfig, or --kubeconfig= to publish nothing", exitFailure},
		{"a host name that is no node name", env(kubeconfig), host("edge_1"), nil,
			`--node-name defaults to the host name "edge_1", which is not a valid node name: `, exitUsage},
		{"an empty host name", env(kubeconfig), host(" "), nil,
			"--node-name defaults to the host name, which is empty; set --node-name", exitUsage},
		{"no host name", env(kubeconfig), func() (string, error) { return "", errors.New("uname failed") }, nil,
			"--node-name defaults to the host name: uname failed; set --node-name", exitFailure},
		{"--node-name is checked", env(kubeconfig), host("edge-1"), []string{"--node-name", "Bad_Name"},
			`--node-name "Bad_Name" is not a valid node name: `, exitUsage},
		{"--node-name without a kubeconfig", env(""), host("edge-1"), []string{"--node-name", "n1"},
			"--node-name needs --kubeconfig or $KUBECONFIG", exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := options(t, tc.getenv, tc.hostname, tc.args...).config()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, tc.code, exitCode(withExitCode(exitUsage, err)))
		})
	}
}

// serve started where $KUBECONFIG is set publishes the devices of the Node
// named as the host to that cluster, and says so; --kubeconfig= stops it.
func TestServePublishesWithTheEnvironmentsDefaults(t *testing.T) {
	hostname, err := os.Hostname()
	require.NoError(t, err)
	node := strings.ToLower(strings.TrimSpace(hostname))
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		t.Skipf("the host name %q is not a node name: %v", node, errs)
	}
	api := &fakeAPIServer{node: node}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	dir := shortTempDir(t)
	sockDir := filepath.Join(dir, "dp")
	env := []string{envKubeconfig + "=" + writeKubeconfig(t, dir, srv.URL)}

	s := launchServeEnv(t, env, filepath.Join(dir, "ctl.sock"), "--socket-dir", sockDir, "--register-node")
	s.waitReady()
	startPlugin(t, sockDir, gpus(2))
	require.True(t, eventually(10*time.Second, s.exited, func() bool {
		_, applied := api.snapshot()
		return len(applied) > 0 && strings.Contains(applied[len(applied)-1], `"allocatable":{"example.com/gpu":"2"}`)
	}), s.log.String())
	requests, _ := api.snapshot()
	assert.Equal(t, "GET /api/v1/nodes/"+node+"?", requests[0])
	assert.Contains(t, s.log.String(), fmt.Sprintf(`"Publishing device resources in the node status" node=%q registerNode=true kubeconfig=%q`,
		node, "$KUBECONFIG="+filepath.Join(dir, "kubeconfig")))
	assert.Equal(t, 0, s.stop(syscall.SIGTERM))

	quiet := launchServeEnv(t, env, filepath.Join(dir, "ctl.sock"), "--socket-dir", sockDir, "--kubeconfig=")
	quiet.waitLog(`"Serving"`)
	assert.NotContains(t, quiet.log.String(), "Publishing device resources")
	assert.Equal(t, 0, quiet.stop(syscall.SIGTERM))
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
