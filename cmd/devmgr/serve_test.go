package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"

	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podinfo"
)

const (
	trainingPod  = "../../testdata/serve/training.yaml"  // uid training-1: init 1 gpu, app 2 gpus, one plain container
	inferencePod = "../../testdata/serve/inference.json" // no uid: 1 gpu
)

// jsonKeys returns the keys of a JSON object, sorted.
func jsonKeys(t *testing.T, v any) []string {
	t.Helper()
	m, isObject := v.(map[string]any)
	require.True(t, isObject, "want a JSON object, got %T", v)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// The whole life of "devmgr serve" as a plugin author sees it: stale sockets
// go at start, a plugin registers, pods are admitted (from a file and from
// stdin), listed and released with the client commands, every change is
// logged, and SIGTERM ends it with exit 0, removing only its own sockets.
func TestServeEndToEnd(t *testing.T) {
	dir := shortTempDir(t)
	ctl := filepath.Join(dir, "ctl.sock")
	oldPlugin := filepath.Join(dir, "old-plugin.sock")
	staleSocket(t, oldPlugin)
	staleSocket(t, ctl)
	keep := filepath.Join(dir, "keep.txt")
	require.NoError(t, os.WriteFile(keep, []byte("not a socket"), 0o600))

	srv := startServe(t, ctl, "--socket-dir", dir, "--numa-nodes", "1,0")
	assert.False(t, exists(oldPlugin), "stale plugin sockets are removed at start")
	assert.True(t, exists(keep), "regular files are kept")
	srv.waitLog("Removed stale control socket")

	p := startPlugin(t, dir, gpus(4))
	api := newAPIClient(t, ctl)
	api.waitStatus("4 allocatable devices", func(st statusResponse) bool {
		r := st.resource(gpu)
		return r != nil && r.Allocatable == 4
	})
	srv.waitLog(`"Device plugin registered" resourceName="example.com/gpu" socketPath="` + p.SocketPath() + `"`)
	srv.waitLog(`"Devices updated" resourceName="example.com/gpu" devices=4 healthy=4 added=["gpu-0","gpu-1","gpu-2","gpu-3"]`)
	srv.waitLog(`"Capacity changed" resourceName="example.com/gpu" capacity=4 allocatable=4`)

	t.Run("status", func(t *testing.T) {
		out := ok(t, nil, "status", "--control-socket", ctl).stdout
		assert.Contains(t, out, "NUMA nodes: 0,1")
		assert.Regexp(t, `(?m)^example.com/gpu +4 +4 +0 +4\b`, out)
		assert.Regexp(t, `(?m)^example.com/gpu +gpu-1 +Healthy +1 +no$`, out)
		assert.Regexp(t, `(?m)^example.com/gpu +`+p.SocketPath()+` +no +yes +running$`, out)

		var st map[string]any
		require.NoError(t, json.Unmarshal([]byte(ok(t, nil, "status", "--control-socket", ctl, "--json").stdout), &st))
		assert.Equal(t, []string{"endpoints", "manager", "resources"}, jsonKeys(t, st))
		res := st["resources"].([]any)[0]
		assert.Equal(t, []string{"allocatable", "allocated", "capacity", "devices", "free", "name", "restoredFromCheckpoint"}, jsonKeys(t, res))
		assert.Equal(t, []string{"allocated", "health", "id", "numa"}, jsonKeys(t, res.(map[string]any)["devices"].([]any)[0]))
		ep := st["endpoints"].([]any)[0]
		assert.Equal(t, []string{"options", "resource", "socket", "stopped"}, jsonKeys(t, ep))
		assert.Equal(t, []string{"getPreferredAllocationAvailable", "preStartRequired"}, jsonKeys(t, ep.(map[string]any)["options"]))
	})

	t.Run("admit", func(t *testing.T) {
		out := ok(t, nil, "admit", "--control-socket", ctl, "-f", trainingPod).stdout
		assert.Contains(t, out, "Pod ml/training admitted (uid training-1).")
		assert.Regexp(t, `(?m)^prepare +example.com/gpu +gpu-0$`, out)
		assert.Regexp(t, `(?m)^train +example.com/gpu +gpu-0,gpu-1$`, out, "the app container reuses the init container's device")
		assert.Regexp(t, `(?m)^logger +- +-$`, out)
		assert.Regexp(t, `(?m)^train +env +PLUGINTEST_EXAMPLE_COM_GPU=gpu-0,gpu-1$`, out)

		first := ok(t, nil, "admit", "--control-socket", ctl, "-f", trainingPod, "--json").stdout
		again := ok(t, nil, "admit", "--control-socket", ctl, "-f", trainingPod, "--json").stdout
		assert.Equal(t, first, again, "admitting an admitted pod gives the same answer")
		var a map[string]any
		require.NoError(t, json.Unmarshal([]byte(first), &a))
		assert.Equal(t, []string{"containers", "pod"}, jsonKeys(t, a))
		assert.Equal(t, []string{"name", "namespace", "uid"}, jsonKeys(t, a["pod"]))
		c := a["containers"].([]any)[1].(map[string]any)
		assert.Equal(t, []string{"devices", "name", "runOptions"}, jsonKeys(t, c))
		assert.Equal(t, []string{"annotations", "cdiDevices", "devices", "envs", "mounts"}, jsonKeys(t, c["runOptions"]))

		// From standard input, without a UID: one is generated.
		f, err := os.Open(inferencePod)
		require.NoError(t, err)
		defer f.Close()
		var gen admissionResponse
		require.NoError(t, json.Unmarshal([]byte(ok(t, f, "admit", "--control-socket", ctl, "-f", "-", "--json").stdout), &gen))
		assert.NotEmpty(t, gen.Pod.UID)
		assert.Equal(t, "default", gen.Pod.Namespace)
		assert.Equal(t, map[string][]string{gpu: {"gpu-2"}}, gen.Containers[0].Devices)

		calls := p.CallsOf(plugintest.MethodAllocate)
		assert.Len(t, calls, 3, "the plugin's Allocate is called once per container with devices, never for a repeat")
	})

	t.Run("pods", func(t *testing.T) {
		out := ok(t, nil, "pods", "--control-socket", ctl).stdout
		assert.Regexp(t, `(?m)^training-1 +ml/training +train +example.com/gpu +gpu-0,gpu-1$`, out)
		assert.Regexp(t, `(?m)^\S+ +default/inference +serve +example.com/gpu +gpu-2$`, out)

		var pods map[string]any
		require.NoError(t, json.Unmarshal([]byte(ok(t, nil, "pods", "--control-socket", ctl, "--json").stdout), &pods))
		assert.Equal(t, []string{"pods"}, jsonKeys(t, pods))
		list := pods["pods"].([]any)
		require.Len(t, list, 2)
		assert.Equal(t, []string{"containers", "name", "namespace", "uid"}, jsonKeys(t, list[0]))
		assert.Equal(t, []string{"devices", "name"}, jsonKeys(t, list[0].(map[string]any)["containers"].([]any)[0]))

		st := api.status()
		assert.Equal(t, 3, st.resource(gpu).Allocated)
		assert.Equal(t, 1, st.resource(gpu).Free)
	})

	t.Run("release", func(t *testing.T) {
		out := ok(t, nil, "release", "--control-socket", ctl, "training-1").stdout
		assert.Equal(t, "pod ml/training released (uid training-1)\n", out)
		fails(t, nil, []string{"release", "--control-socket", ctl, "training-1"},
			`pod "training-1" is not admitted (404 Not Found)`)
		res := run(t, nil, "release", "--control-socket", ctl, "training-1", "--json")
		assert.NotEqual(t, 0, res.code)
		assert.JSONEq(t, `{"error":"pod \"training-1\" is not admitted","reason":"NotFound"}`, res.stdout)
		assert.Equal(t, 1, api.status().resource(gpu).Allocated)
	})

	srv.waitLog(`"Admitted pod" logger="control" pod="ml/training" podUID="training-1"`)
	srv.waitLog(`"Released pod" logger="control" pod="ml/training" podUID="training-1"`)

	// The plugin goes: the manager marks its devices unhealthy.
	p.Stop()
	srv.waitLog(`"Device plugin disconnected; its devices are unhealthy until it registers again"`)
	srv.waitLog(`"Capacity changed" resourceName="example.com/gpu" capacity=4 allocatable=0`)

	require.Equal(t, 0, srv.stop(syscall.SIGTERM))
	assert.False(t, exists(ctl), "the control socket is removed")
	assert.False(t, exists(filepath.Join(dir, "kubelet.sock")), "kubelet.sock is removed")
	for _, name := range []string{"kubelet_internal_checkpoint", podsFileName, "keep.txt"} {
		assert.True(t, exists(filepath.Join(dir, name)), "%s is kept", name)
	}
	assert.Contains(t, srv.log.String(), `"Shutting down"`)
}

// Restarting "devmgr serve" on the same directories keeps the allocations:
// the manager restores its checkpoint and serve its admitted pods, the
// plugin comes back, and the devices held before the restart are still
// held (and not handed out again). The logs are JSON here.
func TestServeRestartKeepsAllocations(t *testing.T) {
	dir := shortTempDir(t)
	ctl := filepath.Join(dir, "ctl.sock")
	args := []string{"--socket-dir", dir, "--numa-nodes", "0,1", "--log-format", "json", "-v", "2"}
	srv, p, api, before := admitTraining(t, dir, ctl, args...)
	training, err := os.ReadFile(trainingPod)
	require.NoError(t, err)
	var admitted admissionResponse
	require.NoError(t, json.Unmarshal(before, &admitted))
	held := admitted.Containers[1].Devices[gpu]
	require.Len(t, held, 2)
	require.Equal(t, 0, srv.stop(syscall.SIGINT))
	assert.True(t, exists(p.SocketPath()), "serve leaves the plugin's socket alone when it stops")
	assert.False(t, exists(ctl))

	assert.Contains(t, srv.log.String(), `"msg":"Registered device plugin"`, "-v 2 shows the manager's own logs")
	// Every line of the JSON log is a JSON object with a message.
	sc := bufio.NewScanner(strings.NewReader(srv.log.String()))
	for sc.Scan() {
		var line map[string]any
		if assert.NoError(t, json.Unmarshal(sc.Bytes(), &line), "log line %q", sc.Text()) {
			assert.Contains(t, line, "msg")
		}
	}

	// The plugin is still running, but its socket goes when serve restarts.
	srv = startServe(t, ctl, args...)
	assert.False(t, exists(p.SocketPath()), "serve removed the plugin's socket: the plugin must register again")
	st := api.status()
	r := st.resource(gpu)
	require.NotNil(t, r, "the resource is restored from the checkpoint")
	assert.True(t, r.RestoredFromCheckpoint)
	assert.Equal(t, 2, r.Allocated)
	srv.waitLog(`"msg":"Restored admitted pods"`)

	code, after := api.do(http.MethodPost, pathPods, training)
	require.Equal(t, http.StatusOK, code, string(after))
	assert.JSONEq(t, string(before), string(after), "the restored pod gives the answer it got before the restart")
	code, list := api.do(http.MethodGet, pathPods, nil)
	require.Equal(t, http.StatusOK, code)
	assert.JSONEq(t, `{"pods":[{"uid":"training-1","name":"training","namespace":"ml","containers":[
		{"name":"prepare","devices":{"example.com/gpu":["gpu-0"]}},
		{"name":"train","devices":{"example.com/gpu":["gpu-0","gpu-1"]}},
		{"name":"logger","devices":{}}]}]}`, string(list))

	// The plugin restarts and registers again, as real plugins do when
	// kubelet.sock is created anew.
	p.Stop()
	startPlugin(t, dir, gpus(4))
	api.waitStatus("the plugin back", func(st statusResponse) bool {
		r := st.resource(gpu)
		return r != nil && r.Allocatable == 4 && !r.RestoredFromCheckpoint
	})
	r = api.status().resource(gpu)
	assert.Equal(t, 2, r.Allocated, "the allocation is kept")
	assert.Equal(t, 2, r.Free)

	// Devices held before the restart are not handed out again.
	big := `{"metadata":{"name":"big","uid":"big-1"},"spec":{"containers":[{"name":"c","resources":{"limits":{"example.com/gpu":3}}}]}}`
	res := fails(t, strings.NewReader(big), []string{"admit", "--control-socket", ctl, "-f", "-"},
		`container "c": requested number of devices unavailable for example.com/gpu. Requested: 3, Available: 2 (409 Conflict)`)
	assert.Empty(t, res.stdout)
	small := strings.Replace(big, `"example.com/gpu":3`, `"example.com/gpu":2`, 1)
	var got admissionResponse
	require.NoError(t, json.Unmarshal([]byte(ok(t, strings.NewReader(small), "admit", "--control-socket", ctl, "-f", "-", "--json").stdout), &got))
	assert.Equal(t, []string{"gpu-2", "gpu-3"}, got.Containers[0].Devices[gpu])

	require.Equal(t, 0, srv.stop(syscall.SIGTERM))
	assert.False(t, exists(ctl))
}

// Bad input gets a clear message and a non-zero exit, from the client
// commands and from serve itself.
func TestCommandErrors(t *testing.T) {
	dir := shortTempDir(t)
	ctl := filepath.Join(dir, "ctl.sock")
	missing := filepath.Join(dir, "missing.sock")
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o600))

	t.Run("without a server", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			args []string
			code int
			want []string
		}{
			{"serve without flags", []string{"serve"}, exitUsage, []string{`required flag(s) "socket-dir" not set`}},
			{"serve without a control socket", []string{"serve", "--socket-dir", dir}, exitUsage, []string{"no control socket: set --control-socket or $DEVMGR_CONTROL_SOCKET"}},
			{"status without a socket", []string{"status"}, exitUsage, []string{"no control socket: set --control-socket or $DEVMGR_CONTROL_SOCKET"}},
			{"pods without a socket", []string{"pods"}, exitUsage, []string{"no control socket: set --control-socket or $DEVMGR_CONTROL_SOCKET"}},
			{"admit without a file", []string{"admit", "--control-socket", missing}, exitUsage, []string{`required flag(s) "filename" not set`}},
			{"release without a UID", []string{"release", "--control-socket", missing}, exitUsage, []string{"missing UID: usage: devmgr release [--control-socket PATH] UID"}},
			{"unknown flag", []string{"pods", "--control-sock", missing}, exitUsage, []string{"unknown flag: --control-sock"}},
			{"control socket not there", []string{"status", "--control-socket", missing}, exitNotFound,
				[]string{"cannot reach devmgr serve on " + missing, "connect: no such file or directory"}},
			{"release, control socket not there", []string{"release", "--control-socket", missing, "u"}, exitNotFound,
				[]string{"cannot reach devmgr serve on " + missing}},
			{"control socket is a regular file", []string{"pods", "--control-socket", file}, exitNotFound,
				[]string{"cannot reach devmgr serve on " + file, "connection refused"}},
			{"missing pod file", []string{"admit", "--control-socket", missing, "-f", filepath.Join(dir, "nope.yaml")}, exitNotFound,
				[]string{"read the pod: open " + filepath.Join(dir, "nope.yaml") + ": no such file or directory"}},
			{"pod file is a directory", []string{"admit", "--control-socket", missing, "-f", dir}, exitFailure,
				[]string{"read the pod: read " + dir + ": is a directory"}},
			{"socket dir is a regular file", []string{"serve", "--socket-dir", file, "--control-socket", ctl}, exitUsage,
				[]string{"--socket-dir " + file + " is not a directory"}},
			{"checkpoint dir is a regular file", []string{"serve", "--socket-dir", dir, "--checkpoint-dir", file, "--control-socket", ctl}, exitUsage,
				[]string{"--checkpoint-dir " + file + " is not a directory"}},
			{"serve's control socket is a regular file", []string{"serve", "--socket-dir", dir, "--control-socket", file}, exitFailure,
				[]string{"control socket " + file + " exists and is not a socket"}},
			{"bad log format", []string{"serve", "--socket-dir", dir, "--control-socket", ctl, "--log-format", "xml"}, exitUsage,
				[]string{`--log-format must be text or json, not "xml"`}},
			{"bad NUMA node", []string{"serve", "--socket-dir", dir, "--control-socket", ctl, "--numa-nodes", "0,64"}, exitFailure,
				[]string{"NUMA node 64 out of range 0-63"}},
			{"NUMA nodes not numbers", []string{"serve", "--socket-dir", dir, "--control-socket", ctl, "--numa-nodes", "a"}, exitUsage,
				[]string{`invalid argument "a" for "--numa-nodes" flag`}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				res := fails(t, nil, tc.args, tc.want...)
				assert.Equal(t, tc.code, res.code, res.stderr)
				assert.True(t, strings.HasPrefix(res.stderr, "devmgr: ") || strings.Contains(res.stderr, "Error: "),
					"the error is printed: %q", res.stderr)
			})
		}
		assert.False(t, exists(ctl), "a serve that failed to start leaves no control socket")
	})

	srv := startServe(t, ctl, "--socket-dir", dir, "--numa-nodes", "0")
	startPlugin(t, dir, gpus(2))
	api := newAPIClient(t, ctl)
	api.waitStatus("2 allocatable devices", func(st statusResponse) bool {
		r := st.resource(gpu)
		return r != nil && r.Allocatable == 2
	})
	pod := func(limits string) string {
		return `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{` + limits + `}}}]}}`
	}

	t.Run("with a server", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			body string
			want []string
		}{
			// Every refusal exits exitRefused.
			{"malformed pod file", "spec: [", []string{"devmgr: not JSON or YAML: yaml: line 1: did not find expected node content (400 Bad Request)"}},
			{"malformed JSON", `{"spec": {`, []string{"devmgr: not JSON or YAML: yaml: line 1: did not find expected node content (400 Bad Request)"}},
			{"unknown field", "spec:\n  containers:\n  - name: c\n    resource: {}\n", []string{`devmgr: not a Pod: unknown field "resource" (400 Bad Request)`}},
			{"pod file too large", strings.Repeat("#", maxPodBytes+1), []string{
				"devmgr: the request body is larger than 4194304 bytes (4 MiB), the most a pod may take (413 Request Entity Too Large)"}},
			{"too many containers", manyContainers(20000), []string{
				"devmgr: invalid pod: the pod has 20000 containers (init and app together); devmgr admits at most 1000 (422 Unprocessable Entity)"}},
			{"not a pod", "kind: Deployment\n", []string{`kind is "Deployment", want Pod`, "(422 Unprocessable Entity)"}},
			{"no containers", "metadata: {name: p}\n", []string{"invalid pod: spec.containers is empty", "(422 Unprocessable Entity)"}},
			{"devices short", pod(`"example.com/gpu":3`),
				[]string{`container "c": requested number of devices unavailable for example.com/gpu. Requested: 3, Available: 2 (409 Conflict)`}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				res := fails(t, strings.NewReader(tc.body), []string{"admit", "--control-socket", ctl, "-f", "-"}, tc.want...)
				assert.Equal(t, exitRefused, res.code)
				assert.Empty(t, res.stdout)
			})
		}
		res := run(t, strings.NewReader(pod(`"example.com/gpu":3`)), "admit", "--control-socket", ctl, "-f", "-", "--json")
		assert.Equal(t, exitRefused, res.code)
		assert.JSONEq(t, `{"error":"requested number of devices unavailable for example.com/gpu. Requested: 3, Available: 2",
			"container":"c","reason":"DevicesUnavailable"}`, res.stdout, "--json prints the error answer as is")

		res = fails(t, strings.NewReader("  \n"), []string{"admit", "--control-socket", ctl, "-f", "-"}, "read the pod: standard input is empty")
		assert.Equal(t, exitRefused, res.code)
		res = fails(t, nil, []string{"release", "--control-socket", ctl, "nobody"}, `pod "nobody" is not admitted (404 Not Found)`)
		assert.Equal(t, exitNotFound, res.code)
		st := api.status()
		assert.Equal(t, 0, st.resource(gpu).Allocated, "failed admissions hold nothing")
		code, raw := api.do(http.MethodGet, pathPods, nil)
		assert.Equal(t, http.StatusOK, code)
		assert.JSONEq(t, `{"pods":[]}`, string(raw))
	})

	// The kubelet ignores extended resources that no plugin registered (an
	// admin may advertise them by hand): so does devmgr, unless
	// --require-plugin names them. The pod is admitted with no devices.
	t.Run("unknown resource", func(t *testing.T) {
		out := ok(t, strings.NewReader(pod(`"example.com/fpga":1`)), "admit", "--control-socket", ctl, "-f", "-").stdout
		assert.Regexp(t, `(?m)^c +- +-$`, out)
	})

	t.Run("a second serve", func(t *testing.T) {
		fails(t, nil, []string{"serve", "--socket-dir", shortTempDir(t), "--control-socket", ctl},
			"control socket "+ctl+" is in use: is another devmgr serve running?")
		fails(t, nil, []string{"serve", "--socket-dir", dir, "--control-socket", filepath.Join(dir, "other.sock")},
			"start device manager: device plugin socket directory in use: another device manager holds "+dir,
			"stop it or choose another directory")
		assert.False(t, exists(filepath.Join(dir, "other.sock")))
	})
	require.Equal(t, 0, srv.stop(syscall.SIGTERM))
}

// A pod whose admission a kill cut short has devices in the checkpoint but no
// line in the pod file: serve releases them before it answers, so that status
// and pods agree from the first request.
func TestServeReleasesUnacknowledgedAdmissionsAtStart(t *testing.T) {
	dir := shortTempDir(t)
	ctl := filepath.Join(dir, "ctl.sock")
	args := []string{"--socket-dir", dir}
	srv, _, api, _ := admitTraining(t, dir, ctl, args...)
	require.Equal(t, 0, srv.stop(syscall.SIGTERM))

	// The pod file as a kill between the checkpoint's write and the pod
	// file's would leave it; and a temporary file that kill left behind.
	store := newPodStore(dir)
	require.NoError(t, store.sync(func() []*v1.Pod { return nil }))
	tmp := filepath.Join(dir, ".devmgr-serve-pods.json.tmp-123")
	require.NoError(t, os.WriteFile(tmp, []byte("{"), 0o600))

	startServe(t, ctl, args...)
	r := api.status().resource(gpu)
	require.NotNil(t, r)
	assert.Zero(t, r.Allocated, "the first answer counts no device for a pod serve never acknowledged")
	code, list := api.do(http.MethodGet, pathPods, nil)
	require.Equal(t, http.StatusOK, code)
	assert.JSONEq(t, `{"pods":[]}`, string(list))
	assert.False(t, exists(tmp), "the temporary file of a cut write is removed")
}

// serve, like the client commands, takes its control socket from
// $DEVMGR_CONTROL_SOCKET when --control-socket is absent.
func TestServeTakesTheControlSocketFromTheEnvironment(t *testing.T) {
	dir := shortTempDir(t)
	ctl := filepath.Join(dir, "env.sock")
	cmd := exec.Command(binary(t), "serve", "--socket-dir", dir)
	cmd.Env = append(os.Environ(), envControlSocket+"="+ctl)
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	api := newAPIClient(t, ctl)
	answered := eventually(5*time.Second, exited, func() bool {
		code, _ := api.tryDo(http.MethodGet, pathStatus, nil)
		return code == http.StatusOK
	})
	require.True(t, answered, "serve did not answer on $%s=%s; output:\n%s", envControlSocket, ctl, log.String())
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	<-exited
	assert.Equal(t, 0, cmd.ProcessState.ExitCode(), log.String())
	assert.False(t, exists(ctl), "serve removes the control socket it took from the environment")
}

// --send-pod-info names the pod and container of each Allocate call in its
// metadata; without it no call does, as with the kubelet.
func TestServeSendPodInfo(t *testing.T) {
	for _, send := range []bool{true, false} {
		dir := shortTempDir(t)
		ctl := filepath.Join(dir, "ctl.sock")
		args := []string{"--socket-dir", dir, "--numa-nodes", "0"}
		if send {
			args = append(args, "--send-pod-info")
		}
		srv, p, _, _ := admitTraining(t, dir, ctl, args...)
		var got []podinfo.Info
		for _, c := range p.CallsOf(plugintest.MethodAllocate) {
			info, ok := c.PodInfo()
			assert.Equal(t, send, ok, "--send-pod-info %v", send)
			got = append(got, info)
		}
		if send {
			pod := podinfo.Info{Kind: podinfo.KindPod, Namespace: "ml", Name: "training", UID: "training-1"}
			prepare, train := pod, pod
			prepare.Container, train.Container = "prepare", "train"
			assert.Equal(t, []podinfo.Info{prepare, train}, got)
		}
		require.Equal(t, 0, srv.stop(syscall.SIGINT))
	}
}
