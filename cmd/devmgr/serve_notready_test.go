package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// After a restart, before the plugin is back, serve refuses an admission as
// not ready: 503 with Retry-After and reason PluginNotReady, and admit exits
// 5. With --plugin-wait the admission waits instead, and succeeds once the
// plugin registers again.
func TestServeNotReadyAfterRestart(t *testing.T) {
	dir := shortTempDir(t)
	ctl := filepath.Join(dir, "ctl.sock")
	args := []string{"--socket-dir", dir, "--numa-nodes", "0,1", "-v", "3"}
	srv, p, api, _ := admitTraining(t, dir, ctl, args...)
	require.Equal(t, 0, srv.stop(syscall.SIGTERM))
	p.Stop()

	srv = startServe(t, ctl, args...)
	require.NotNil(t, api.status().resource(gpu), "the resource is restored from the checkpoint")
	req, err := http.NewRequest(http.MethodPost, api.base+pathPods, strings.NewReader(gpuPod("late-1", 1)))
	require.NoError(t, err)
	resp, err := api.client.Do(req)
	require.NoError(t, err)
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, resp.Body.Close())
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, string(raw))
	assert.Equal(t, "5", resp.Header.Get("Retry-After"))
	var e errorResponse
	require.NoError(t, json.Unmarshal(raw, &e))
	assert.Equal(t, errorResponse{
		Error: "no healthy devices present; cannot allocate unhealthy devices example.com/gpu: " +
			"device plugin not ready (no plugin instance is connected)",
		Container: "main",
		Reason:    reasonPluginNotReady,
	}, e)

	res := run(t, strings.NewReader(gpuPod("late-1", 1)), "admit", "--control-socket", ctl, "-f", "-")
	assert.Equal(t, exitNotReady, res.code, res.stderr)
	assert.Contains(t, res.stderr, `container "main": no healthy devices present; cannot allocate unhealthy devices example.com/gpu: `+
		"device plugin not ready (no plugin instance is connected) (503 Service Unavailable)")
	require.Equal(t, 0, srv.stop(syscall.SIGTERM))

	srv = startServe(t, ctl, append(args, "--plugin-wait", "1m")...)
	admit := exec.Command(binary(t), "admit", "--control-socket", ctl, "-f", "-", "--json", "--timeout", "30s")
	admit.Stdin = strings.NewReader(gpuPod("late-2", 1))
	var stdout, stderr bytes.Buffer
	admit.Stdout, admit.Stderr = &stdout, &stderr
	require.NoError(t, admit.Start())
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = admit.Process.Kill()
			_ = admit.Wait()
		}
	})
	srv.waitLog("Waiting for a device plugin")
	startPlugin(t, dir, gpus(4))
	err = admit.Wait()
	waited = true
	require.NoError(t, err, "admit: %s", stderr.String())
	var a admissionResponse
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &a))
	assert.Equal(t, "late-2", a.Pod.UID)
	assert.Len(t, a.Containers[0].Devices[gpu], 1)
	require.Equal(t, 0, srv.stop(syscall.SIGTERM))
}
