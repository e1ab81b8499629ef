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

	"github.com/openkubelet/devmgr/plugintest"
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

// With --plugin-wait, a pod waiting for its plugin holds up no other pod: a
// pod for a ready resource is admitted while it waits, and it is admitted
// once its plugin lists its devices.
func TestServePodWaitingForItsPluginHoldsUpNoOtherPod(t *testing.T) {
	dir := shortTempDir(t)
	ctl := filepath.Join(dir, "ctl.sock")
	srv := startServe(t, ctl, "--socket-dir", dir, "-v", "3", "--plugin-wait", "1m")
	gpuPlugin, err := plugintest.New(plugintest.Options{ResourceName: gpu, SocketDir: dir, Devices: gpus(1), NoReregister: true})
	require.NoError(t, err)
	t.Cleanup(gpuPlugin.Stop)
	listGPUs := gpuPlugin.Block(plugintest.MethodListAndWatch)
	t.Cleanup(listGPUs)
	require.NoError(t, gpuPlugin.Start())
	require.NoError(t, gpuPlugin.Register(filepath.Join(dir, "kubelet.sock")))

	admitA := exec.Command(binary(t), "admit", "--control-socket", ctl, "-f", "-", "--json", "--timeout", "30s")
	admitA.Stdin = strings.NewReader(gpuPod("waits", 1))
	var stdout, stderr bytes.Buffer
	admitA.Stdout, admitA.Stderr = &stdout, &stderr
	require.NoError(t, admitA.Start())
	var waitErr error
	exited := make(chan struct{}) // closed once admitA is reaped, waitErr set
	go func() {
		waitErr = admitA.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = admitA.Process.Kill() // fails once it has exited
		<-exited
	})
	srv.waitLog("Waiting for a device plugin")

	nicPlugin, err := plugintest.New(plugintest.Options{ResourceName: "example.com/nic", SocketDir: dir, Devices: gpus(1)})
	require.NoError(t, err)
	t.Cleanup(nicPlugin.Stop)
	require.NoError(t, nicPlugin.Start())
	require.NoError(t, nicPlugin.Register(filepath.Join(dir, "kubelet.sock")))
	api := newAPIClient(t, ctl)
	api.waitStatus("the nic allocatable", func(st statusResponse) bool {
		r := st.resource("example.com/nic")
		return r != nil && r.Allocatable == 1
	})
	nicPod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"other","uid":"other"},
"spec":{"containers":[{"name":"main","resources":{"limits":{"example.com/nic":"1"}}}]}}`
	res := run(t, strings.NewReader(nicPod), "admit", "--control-socket", ctl, "-f", "-", "--json", "--timeout", "10s")
	require.Equal(t, 0, res.code, "the pod for a ready resource is admitted while the other waits: %s", res.stderr)
	var b admissionResponse
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &b))
	assert.Equal(t, []string{"gpu-0"}, b.Containers[0].Devices["example.com/nic"])
	select {
	case <-exited:
		require.FailNow(t, "the waiting pod's admission ended before its plugin listed its devices", "%v: %s", waitErr, stderr.String())
	default:
	}

	listGPUs()
	<-exited
	require.NoError(t, waitErr, "admit: %s", stderr.String())
	var a admissionResponse
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &a))
	assert.Equal(t, []string{"gpu-0"}, a.Containers[0].Devices[gpu])
	require.Equal(t, 0, srv.stop(syscall.SIGTERM))
}
