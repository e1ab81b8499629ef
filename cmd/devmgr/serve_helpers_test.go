package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
)

// serve publishes to the cluster of $KUBECONFIG when --kubeconfig is absent:
// the tests, and the devmgr commands they run, never read the one of
// whoever runs them. A test that wants it sets it.
func init() { _ = os.Unsetenv(envKubeconfig) }

// binary returns the devmgr binary that the package's TestMain built (with
// the race detector when the tests run with it, so that a race in "devmgr
// serve" fails its test: the process exits 66).
func binary(t *testing.T) string {
	t.Helper()
	require.NotEmpty(t, devmgrBinary, "TestMain builds the devmgr binary")
	return devmgrBinary
}

// shortTempDir returns a new directory short enough for unix socket paths,
// removed when the test ends.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ds")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// syncBuffer is a bytes.Buffer safe for a process writing and a test reading.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// serveProc is a running "devmgr serve".
type serveProc struct {
	*proc
	ctl string
}

// proc is a devmgr command a test runs in the background.
type proc struct {
	t       *testing.T
	cmd     *exec.Cmd
	log     *syncBuffer   // its stdout and stderr
	exited  chan struct{} // closed once the process is reaped
	waitErr error         // valid once exited is closed
}

// startProc starts "devmgr args..." with env added to the test's
// environment. It is killed when the test ends, if still running, and its
// output is logged if the test failed.
func startProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, log: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(binary(t), args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	require.NoError(t, p.cmd.Start())
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("devmgr %s output:\n%s", args[0], p.log.String())
		}
	})
	return p
}

// startServe starts "devmgr serve --control-socket ctl args..." and waits
// until its control socket answers. The process is killed when the test
// ends, if still running.
func startServe(t *testing.T, ctl string, args ...string) *serveProc {
	t.Helper()
	p := launchServe(t, ctl, args...)
	p.waitReady()
	return p
}

// launchServe starts "devmgr serve" without waiting for it.
func launchServe(t *testing.T, ctl string, args ...string) *serveProc {
	t.Helper()
	return launchServeEnv(t, nil, ctl, args...)
}

// launchServeEnv starts "devmgr serve" with env (KEY=value) added to its
// environment, without waiting for it.
func launchServeEnv(t *testing.T, env []string, ctl string, args ...string) *serveProc {
	t.Helper()
	return &serveProc{proc: startProc(t, env, append([]string{"serve", "--control-socket", ctl}, args...)...), ctl: ctl}
}

// waitReady waits, up to 5 s, for the control socket to answer.
func (p *serveProc) waitReady() {
	p.t.Helper()
	c := newAPIClient(p.t, p.ctl)
	ok := eventually(5*time.Second, p.exited, func() bool {
		code, _ := c.tryDo(http.MethodGet, pathStatus, nil)
		return code == http.StatusOK
	})
	require.True(p.t, ok, "devmgr serve did not answer on %s within 5s; output:\n%s", p.ctl, p.log.String())
}

// wait waits up to timeout for the process to exit and returns its exit code.
func (p *serveProc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(timeout):
		require.FailNow(p.t, "devmgr serve did not exit", "within %s; output:\n%s", timeout, p.log.String())
	}
	var ee *exec.ExitError
	if errors.As(p.waitErr, &ee) {
		return ee.ExitCode()
	}
	require.NoError(p.t, p.waitErr)
	return 0
}

// stop sends sig and returns the exit code; the process must exit within
// 10 s.
func (p *serveProc) stop(sig syscall.Signal) int {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(sig))
	return p.wait(10 * time.Second)
}

// waitLog waits up to 5 s for the output to contain s.
func (p *serveProc) waitLog(s string) {
	p.t.Helper()
	ok := eventually(5*time.Second, nil, func() bool { return strings.Contains(p.log.String(), s) })
	require.True(p.t, ok, "devmgr serve did not log %q; output:\n%s", s, p.log.String())
}

// eventually polls cond every 20 ms until it holds (true), the deadline
// passes or stop is closed (false).
func eventually(deadline time.Duration, stop <-chan struct{}, cond func() bool) bool {
	timeout := time.NewTimer(deadline)
	defer timeout.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond() {
			return true
		}
		select {
		case <-timeout.C:
			return cond()
		case <-stop:
			return false
		case <-tick.C:
		}
	}
}

// apiClient talks to a control socket directly.
type apiClient struct {
	t      *testing.T
	base   string
	client *http.Client
}

// newAPIClient returns a client for the control socket at path, or, for an
// "http://" address, for that server.
func newAPIClient(t *testing.T, path string) *apiClient {
	transport := &http.Transport{}
	base := path
	if !strings.HasPrefix(path, "http://") {
		base = "http://devmgr"
		transport.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	}
	t.Cleanup(transport.CloseIdleConnections)
	return &apiClient{t: t, base: base, client: &http.Client{Transport: transport, Timeout: 30 * time.Second}}
}

// tryDo sends a request; code 0 means no answer.
func (c *apiClient) tryDo(method, path string, body []byte) (int, []byte) {
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil
	}
	return resp.StatusCode, raw
}

// do sends a request that must be answered.
func (c *apiClient) do(method, path string, body []byte) (int, []byte) {
	c.t.Helper()
	code, raw := c.tryDo(method, path, body)
	require.NotZero(c.t, code, "%s %s: no answer", method, path)
	return code, raw
}

// status returns GET /v1/status.
func (c *apiClient) status() statusResponse {
	c.t.Helper()
	code, raw := c.do(http.MethodGet, pathStatus, nil)
	require.Equal(c.t, http.StatusOK, code, string(raw))
	var st statusResponse
	require.NoError(c.t, json.Unmarshal(raw, &st))
	return st
}

// waitStatus waits up to 10 s for the status to satisfy cond.
func (c *apiClient) waitStatus(what string, cond func(statusResponse) bool) statusResponse {
	c.t.Helper()
	var last statusResponse
	ok := eventually(10*time.Second, nil, func() bool {
		code, raw := c.tryDo(http.MethodGet, pathStatus, nil)
		if code != http.StatusOK {
			return false
		}
		last = statusResponse{}
		return json.Unmarshal(raw, &last) == nil && cond(last)
	})
	require.True(c.t, ok, "waiting for %s; last status: %+v", what, last)
	return last
}

// resource returns the named resource of st, or nil.
func (st statusResponse) resource(name string) *resourceJSON {
	for i := range st.Resources {
		if st.Resources[i].Name == name {
			return &st.Resources[i]
		}
	}
	return nil
}

const gpu = "example.com/gpu"

// gpus returns n healthy devices gpu-0..gpu-(n-1), on NUMA node i%2.
func gpus(n int) []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, n)
	for i := range n {
		out = append(out, &pluginapi.Device{
			ID:       fmt.Sprintf("gpu-%d", i),
			Health:   pluginapi.Healthy,
			Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(i % 2)}}},
		})
	}
	return out
}

// startPlugin starts a plugin of example.com/gpu with devices in dir and
// registers it on dir/kubelet.sock. It stops when the test ends.
func startPlugin(t *testing.T, dir string, devices []*pluginapi.Device) *plugintest.Plugin {
	t.Helper()
	p, err := plugintest.New(plugintest.Options{
		ResourceName:                    gpu,
		SocketDir:                       dir,
		Devices:                         devices,
		GetPreferredAllocationAvailable: true,
		// The tests decide when the plugin is back after serve restarts.
		NoReregister: true,
	})
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	require.NoError(t, p.Start())
	require.NoError(t, p.Register(filepath.Join(dir, "kubelet.sock")))
	return p
}

// result is the outcome of one devmgr command.
type result struct {
	stdout, stderr string
	code           int
}

// run runs devmgr with args, stdin as its standard input, and returns what
// it printed and its exit code.
func run(t *testing.T, stdin io.Reader, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &stdout, &stderr
	err := cmd.Run()
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
	default:
		require.NoError(t, err, "devmgr %s", strings.Join(args, " "))
	}
	return res
}

// ok runs devmgr and requires exit code 0.
func ok(t *testing.T, stdin io.Reader, args ...string) result {
	t.Helper()
	res := run(t, stdin, args...)
	require.Equal(t, 0, res.code, "devmgr %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), res.stdout, res.stderr)
	return res
}

// fails runs devmgr, requires a non-zero exit code and an error on stderr
// containing every one of want.
func fails(t *testing.T, stdin io.Reader, args []string, want ...string) result {
	t.Helper()
	res := run(t, stdin, args...)
	assert.NotEqual(t, 0, res.code, "devmgr %s should fail; stdout:\n%s", strings.Join(args, " "), res.stdout)
	for _, w := range want {
		assert.Contains(t, res.stderr, w, "devmgr %s", strings.Join(args, " "))
	}
	return res
}

// exists reports whether something is at path.
func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// staleSocket leaves a unix socket file at path that nothing serves.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
	require.True(t, exists(path))
}

// admitTraining starts serve on dir with args and a plugin of four GPUs,
// waits for them, and admits the training pod; it returns serve, the
// plugin, a client and the admission's answer.
func admitTraining(t *testing.T, dir, ctl string, args ...string) (*serveProc, *plugintest.Plugin, *apiClient, []byte) {
	t.Helper()
	srv := startServe(t, ctl, args...)
	p := startPlugin(t, dir, gpus(4))
	api := newAPIClient(t, ctl)
	api.waitStatus("4 allocatable devices", func(st statusResponse) bool {
		r := st.resource(gpu)
		return r != nil && r.Allocatable == 4
	})
	training, err := os.ReadFile(trainingPod)
	require.NoError(t, err)
	code, answer := api.do(http.MethodPost, pathPods, training)
	require.Equal(t, http.StatusOK, code, string(answer))
	return srv, p, api, answer
}
