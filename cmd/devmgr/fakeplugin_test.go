package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openkubelet/devmgr/sanity"
)

// fakePluginProc is a running "devmgr fake-plugin".
type fakePluginProc struct{ *proc }

// startFakePlugin starts "devmgr fake-plugin args..."; it is killed when the
// test ends, if still running.
func startFakePlugin(t *testing.T, args ...string) *fakePluginProc {
	t.Helper()
	return &fakePluginProc{startProc(t, nil, append([]string{"fake-plugin"}, args...)...)}
}

// waitLog waits up to 10 s for the output to match re.
func (p *fakePluginProc) waitLog(re string) {
	p.t.Helper()
	rx := regexp.MustCompile(re)
	ok := eventually(10*time.Second, p.exited, func() bool { return rx.MatchString(p.log.String()) })
	require.True(p.t, ok, "devmgr fake-plugin did not log %q; output:\n%s", re, p.log.String())
}

// stop sends sig and returns the exit code; the process must exit within
// 10 s.
func (p *fakePluginProc) stop(sig syscall.Signal) int {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(sig))
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		require.FailNow(p.t, "devmgr fake-plugin did not exit", "within 10s of %v; output:\n%s", sig, p.log.String())
	}
	var ee *exec.ExitError
	if errors.As(p.waitErr, &ee) {
		return ee.ExitCode()
	}
	require.NoError(p.t, p.waitErr)
	return 0
}

var sanityStatusRow = regexp.MustCompile(`(?m)^(\S+/\S+)\s+(passed|failed|skipped)\s+\S+$`)

// devmgr sanity, run against devmgr fake-plugin, reports every check that
// the command line can run passed: list-and-watch/update alone is skipped,
// since only a Go test can make a plugin send a new list. The plugin waits
// for kubelet.sock, registers again when the restart check re-creates it,
// and exits 0 on SIGTERM, removing its socket.
func TestSanityAgainstFakePlugin(t *testing.T) {
	dir := shortTempDir(t)
	plugin := startFakePlugin(t, "--socket-dir", dir, "--resource", "example.com/gpu",
		"--devices", "3", "--numa", "0,1", "--cdi", "--unhealthy", "gpu-2")
	plugin.waitLog(`Waiting for the kubelet socket to appear" path="` + regexp.QuoteMeta(filepath.Join(dir, "kubelet.sock")))

	res := devmgr(t, "", "sanity", "--socket-dir", dir, "--numa-nodes", "0,1",
		"--register-timeout", "30s", "--reregister-timeout", "30s")
	require.Equal(t, exitOK, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	status := map[string]string{}
	var names []string
	for _, m := range sanityStatusRow.FindAllStringSubmatch(res.stdout, -1) {
		names = append(names, m[1])
		status[m[1]] = m[2]
	}
	assert.Equal(t, sanity.Checks(), names, res.stdout)
	for _, name := range sanity.Checks() {
		want := "passed"
		if name == "list-and-watch/update" {
			want = "skipped"
		}
		assert.Equal(t, want, status[name], "%s\n%s", name, res.stdout)
	}
	assert.Contains(t, res.stdout, "20 passed, 0 failed, 1 skipped")
	plugin.waitLog(`(?s)"Registered".*"Kubelet socket created anew, registering again".*"Registered"`)

	assert.Equal(t, exitOK, plugin.stop(syscall.SIGTERM), plugin.log.String())
	assert.False(t, exists(filepath.Join(dir, "example.com-gpu.sock")), "the plugin removed its socket")
}

// With devmgr serve, the fake plugin's devices appear as the flags say, come
// back after serve restarts, and are allocated with CDI names; SIGINT stops
// it with exit code 0.
func TestFakePluginWithServe(t *testing.T) {
	dir := shortTempDir(t)
	ctl := filepath.Join(dir, "ctl.sock")
	srv := startServe(t, ctl, "--socket-dir", dir, "--numa-nodes", "0,1")
	plugin := startFakePlugin(t, "--socket-dir", dir, "--resource", "example.com/gpu",
		"--devices", "4", "--numa", "0,1", "--cdi", "--unhealthy", "gpu-3,gpu-1")
	api := newAPIClient(t, ctl)
	want := []deviceJSON{
		{ID: "gpu-0", Health: "Healthy", NUMA: []int64{0}},
		{ID: "gpu-1", Health: "Unhealthy", NUMA: []int64{1}},
		{ID: "gpu-2", Health: "Healthy", NUMA: []int64{0}},
		{ID: "gpu-3", Health: "Unhealthy", NUMA: []int64{1}},
	}
	listed := func(st statusResponse) bool {
		r := st.resource("example.com/gpu")
		return r != nil && r.Capacity == 4 && r.Allocatable == 2 && len(st.Endpoints) == 1 && !st.Endpoints[0].Stopped
	}
	st := api.waitStatus("the fake plugin's devices", listed)
	assert.Equal(t, want, st.resource("example.com/gpu").Devices)

	require.Equal(t, exitOK, srv.stop(syscall.SIGTERM))
	startServe(t, ctl, "--socket-dir", dir, "--numa-nodes", "0,1")
	st = api.waitStatus("the fake plugin registered again", listed)
	assert.Equal(t, want, st.resource("example.com/gpu").Devices)

	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","uid":"p-1"},
"spec":{"containers":[{"name":"c","resources":{"limits":{"example.com/gpu":"2"}}}]}}`
	code, answer := api.do(http.MethodPost, pathPods, []byte(pod))
	require.Equal(t, http.StatusOK, code, string(answer))
	for _, id := range []string{"gpu-0", "gpu-2"} {
		assert.Contains(t, string(answer), `"example.com/gpu=`+id+`"`, "the healthy devices, with their CDI names")
	}

	assert.Equal(t, exitOK, plugin.stop(syscall.SIGINT), plugin.log.String())
	assert.Equal(t, 2, strings.Count(plugin.log.String(), `"Registered"`), plugin.log.String())
}

// Bad flags are refused with exit code 2 and a message naming the flag,
// before anything is created.
func TestFakePluginBadFlags(t *testing.T) {
	dir := shortTempDir(t)
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	base := []string{"fake-plugin", "--socket-dir", dir, "--resource", "example.com/gpu"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"fake-plugin", "--resource", "example.com/gpu"}, `required flag(s) "socket-dir" not set`},
		{[]string{"fake-plugin", "--socket-dir", dir}, `required flag(s) "resource" not set`},
		{append(base, "extra"), `devmgr fake-plugin takes no arguments, not ["extra"]`},
		{[]string{"fake-plugin", "--socket-dir", dir, "--resource", "gpu"}, `--resource "gpu" is not an extended resource name`},
		{[]string{"fake-plugin", "--socket-dir", dir, "--resource", "kubernetes.io/gpu"}, `--resource "kubernetes.io/gpu" is not an extended resource name`},
		{[]string{"fake-plugin", "--socket-dir", file, "--resource", "example.com/gpu"}, "--socket-dir " + file + " is not a directory"},
		{[]string{"fake-plugin", "--socket-dir", filepath.Join(dir, strings.Repeat("d", 100)), "--resource", "example.com/gpu"}, "--socket-dir: plugintest: socket path"},
		{append(base, "--devices", "0"), "--devices must be from 1 to 10000, not 0"},
		{append(base, "--devices", "10001"), "--devices must be from 1 to 10000, not 10001"},
		{append(base, "--devices", "two"), `invalid argument "two" for "--devices"`},
		{append(base, "--numa", "0,64"), "--numa: node 64 out of range 0-63"},
		{append(base, "--numa", "-1"), "--numa: node -1 out of range 0-63"},
		{append(base, "--numa", "zero"), `invalid argument "zero" for "--numa"`},
		{append(base, "--unhealthy", "gpu-2"), `--unhealthy: no device "gpu-2"; the devices are gpu-0 to gpu-1`},
		{[]string{"fake-plugin", "--socket-dir", dir, "--resource", "example.com/1gpu", "--cdi"}, "--cdi: example.com/1gpu does not make CDI device names"},
		{append(base, "-v", "-1"), `invalid argument "-1" for "-v, --v" flag: want a number from 0`},
	} {
		// A command line taken as good would run until the context ends.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var stdout, stderr bytes.Buffer
		code := execute(ctx, tc.args, strings.NewReader(""), &stdout, &stderr)
		cancel()
		assert.Equal(t, exitUsage, code, "%q: %s", tc.args, stderr.String())
		assert.Contains(t, stderr.String(), tc.want, "%q", tc.args)
		assert.Empty(t, stdout.String(), "%q", tc.args)
	}
	assert.False(t, exists(filepath.Join(dir, strings.Repeat("d", 100))), "nothing created")
	assert.False(t, exists(filepath.Join(dir, "example.com-gpu.sock")), "nothing served")
}
