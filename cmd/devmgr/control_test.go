package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/textlogger"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podadmit"
)

// controlHarness serves the control API in process, over httptest and on
// the unix socket sock, for a real manager in a temporary directory with one
// plugin of example.com/gpu.
type controlHarness struct {
	dir        string
	sock       string
	mgr        *devicemanager.ManagerImpl
	admitter   *podadmit.Admitter
	plugin     *plugintest.Plugin
	api        *apiClient
	failRecord atomic.Bool
}

func newControlHarness(t *testing.T, devices []*pluginapi.Device, opts ...func(*devicemanager.Options)) *controlHarness {
	t.Helper()
	h := &controlHarness{dir: shortTempDir(t)}
	o := devicemanager.Options{SocketDir: h.dir, NUMANodes: []int{0, 1}, Logger: logr.Discard()}
	for _, f := range opts {
		f(&o)
	}
	mgr, err := devicemanager.NewManagerImpl(o)
	require.NoError(t, err)
	h.mgr = mgr
	h.admitter = podadmit.New(mgr)
	require.NoError(t, mgr.Start(h.admitter.ActivePods, nil, nil, nil))
	t.Cleanup(func() { mgr.Stop() })
	h.plugin = startPlugin(t, h.dir, devices)
	require.True(t, eventually(10*time.Second, nil, func() bool {
		st := mgr.Status()
		return len(st) == 1 && st[0].Capacity == len(devices)
	}), "the plugin's devices reach the manager")

	store := newPodStore(h.dir)
	cs := &controlServer{
		status:   mgr.Status,
		admitter: h.admitter,
		info:     managerJSON{SocketDir: h.dir, CheckpointDir: h.dir, NUMANodes: []int{0, 1}},
		record: func() error {
			if h.failRecord.Load() {
				return errors.New("save admitted pods: no space left on device")
			}
			return store.sync(h.admitter.AdmittedPods)
		},
		log: logr.Discard(),
	}
	srv := httptest.NewServer(cs.handler())
	t.Cleanup(srv.Close)
	h.api = newAPIClient(t, srv.URL)

	h.sock = filepath.Join(h.dir, "ctl.sock")
	l, err := net.Listen("unix", h.sock)
	require.NoError(t, err)
	unix := &http.Server{Handler: cs.handler(), ReadHeaderTimeout: time.Minute}
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.ErrorIs(t, unix.Serve(l), http.ErrServerClosed)
	}()
	t.Cleanup(func() {
		assert.NoError(t, unix.Close())
		<-done
	})
	return h
}

// expect sends a request and checks the answer's status code and JSON.
func (h *controlHarness) expect(t *testing.T, method, path, body string, code int, wantJSON string) {
	t.Helper()
	req, err := http.NewRequest(method, h.api.base+path, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := h.api.client.Do(req)
	require.NoError(t, err, "%s %s", method, path)
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, resp.Body.Close())
	require.NoError(t, err)
	assert.Equal(t, code, resp.StatusCode, "%s %s: %s", method, path, raw)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), "%s %s", method, path)
	assert.JSONEq(t, wantJSON, string(raw), "%s %s", method, path)
}

// manyContainers returns pod "many" with n containers, none asking for
// devices.
func manyContainers(n int) string {
	containers := make([]string, n)
	for i := range containers {
		containers[i] = fmt.Sprintf(`{"name":"c%d"}`, i)
	}
	return `{"metadata":{"name":"many","uid":"many"},"spec":{"containers":[` + strings.Join(containers, ",") + `]}}`
}

// The JSON of every endpoint, field by field, for a pod with an init
// container, an app container reusing its device, and a container without
// devices.
func TestControlAPIJSON(t *testing.T) {
	devices := gpus(3)
	devices = append(devices, &pluginapi.Device{ID: "gpu-x", Health: pluginapi.Unhealthy}) // no topology
	h := newControlHarness(t, devices)
	training, err := os.ReadFile(trainingPod)
	require.NoError(t, err)

	const admission = `{
	  "pod": {"uid": "training-1", "name": "training", "namespace": "ml"},
	  "containers": [
	    {"name": "prepare", "devices": {"example.com/gpu": ["gpu-0"]}, "runOptions": {
	      "envs": [{"name": "PLUGINTEST_EXAMPLE_COM_GPU", "value": "gpu-0"}],
	      "mounts": [{"containerPath": "/run/plugintest/example.com_gpu/gpu-0", "hostPath": "/host/run/plugintest/example.com_gpu/gpu-0", "readOnly": true}],
	      "devices": [{"pathOnHost": "/host/dev/plugintest/example.com_gpu/gpu-0", "pathInContainer": "/dev/plugintest/example.com_gpu/gpu-0", "permissions": "rw"}],
	      "annotations": [{"name": "plugintest/example.com_gpu", "value": "gpu-0"}],
	      "cdiDevices": []}},
	    {"name": "train", "devices": {"example.com/gpu": ["gpu-0", "gpu-1"]}, "runOptions": {
	      "envs": [{"name": "PLUGINTEST_EXAMPLE_COM_GPU", "value": "gpu-0,gpu-1"}],
	      "mounts": [
	        {"containerPath": "/run/plugintest/example.com_gpu/gpu-0", "hostPath": "/host/run/plugintest/example.com_gpu/gpu-0", "readOnly": true},
	        {"containerPath": "/run/plugintest/example.com_gpu/gpu-1", "hostPath": "/host/run/plugintest/example.com_gpu/gpu-1", "readOnly": true}],
	      "devices": [
	        {"pathOnHost": "/host/dev/plugintest/example.com_gpu/gpu-0", "pathInContainer": "/dev/plugintest/example.com_gpu/gpu-0", "permissions": "rw"},
	        {"pathOnHost": "/host/dev/plugintest/example.com_gpu/gpu-1", "pathInContainer": "/dev/plugintest/example.com_gpu/gpu-1", "permissions": "rw"}],
	      "annotations": [{"name": "plugintest/example.com_gpu", "value": "gpu-0,gpu-1"}],
	      "cdiDevices": []}},
	    {"name": "logger", "devices": {}, "runOptions": {"envs": [], "mounts": [], "devices": [], "annotations": [], "cdiDevices": []}}
	  ]
	}`
	h.expect(t, http.MethodPost, pathPods, string(training), http.StatusOK, admission)
	h.expect(t, http.MethodPost, pathPods, string(training), http.StatusOK, admission)
	h.expect(t, http.MethodGet, pathPods+"/training-1", "", http.StatusOK, admission)

	h.expect(t, http.MethodGet, pathStatus, "", http.StatusOK, fmt.Sprintf(`{
	  "resources": [{
	    "name": "example.com/gpu", "capacity": 4, "allocatable": 3, "allocated": 2, "free": 1,
	    "devices": [
	      {"id": "gpu-0", "health": "Healthy", "numa": [0], "allocated": true},
	      {"id": "gpu-1", "health": "Healthy", "numa": [1], "allocated": true},
	      {"id": "gpu-2", "health": "Healthy", "numa": [0], "allocated": false},
	      {"id": "gpu-x", "health": "Unhealthy", "numa": [], "allocated": false}
	    ],
	    "restoredFromCheckpoint": false
	  }],
	  "endpoints": [{
	    "resource": "example.com/gpu", "socket": %[1]q,
	    "options": {"preStartRequired": false, "getPreferredAllocationAvailable": true},
	    "stopped": false
	  }],
	  "manager": {"socketDir": %[2]q, "checkpointDir": %[2]q, "numaNodes": [0, 1]}
	}`, h.plugin.SocketPath(), h.dir))

	h.expect(t, http.MethodGet, pathPods, "", http.StatusOK, `{"pods": [{
	  "uid": "training-1", "name": "training", "namespace": "ml",
	  "containers": [
	    {"name": "prepare", "devices": {"example.com/gpu": ["gpu-0"]}},
	    {"name": "train", "devices": {"example.com/gpu": ["gpu-0", "gpu-1"]}},
	    {"name": "logger", "devices": {}}
	  ]}]}`)

	saved, err := newPodStore(h.dir).load()
	require.NoError(t, err)
	require.Len(t, saved, 1, "the admitted pod is saved")
	assert.Equal(t, "training-1", string(saved[0].UID))

	h.expect(t, http.MethodDelete, pathPods+"/training-1", "", http.StatusOK,
		`{"pod": {"uid": "training-1", "name": "training", "namespace": "ml"}}`)
	h.expect(t, http.MethodGet, pathPods, "", http.StatusOK, `{"pods": []}`)
	saved, err = newPodStore(h.dir).load()
	require.NoError(t, err)
	assert.Empty(t, saved, "the release is saved")
}

func TestControlAPIErrors(t *testing.T) {
	h := newControlHarness(t, gpus(2))
	pod := func(uid, limits string) string {
		return `{"metadata":{"name":"p","uid":"` + uid + `"},"spec":{"containers":[{"name":"c","resources":{"limits":{` + limits + `}}}]}}`
	}
	h.expect(t, http.MethodPost, pathPods, pod("held", `"example.com/gpu":1`), http.StatusOK,
		`{"pod":{"uid":"held","name":"p","namespace":"default"},"containers":[{"name":"c","devices":{"example.com/gpu":["gpu-0"]},
		"runOptions":{"envs":[{"name":"PLUGINTEST_EXAMPLE_COM_GPU","value":"gpu-0"}],
		"mounts":[{"containerPath":"/run/plugintest/example.com_gpu/gpu-0","hostPath":"/host/run/plugintest/example.com_gpu/gpu-0","readOnly":true}],
		"devices":[{"pathOnHost":"/host/dev/plugintest/example.com_gpu/gpu-0","pathInContainer":"/dev/plugintest/example.com_gpu/gpu-0","permissions":"rw"}],
		"annotations":[{"name":"plugintest/example.com_gpu","value":"gpu-0"}],"cdiDevices":[]}}]}`)

	for _, tc := range []struct {
		name, method, path, body string
		code                     int
		want                     string
	}{
		{"empty body", http.MethodPost, pathPods, "", http.StatusBadRequest,
			`{"error":"no pod: the request body is empty; send a Pod as JSON or YAML","reason":"BadRequest"}`},
		{"malformed JSON", http.MethodPost, pathPods, `{"metadata": {"name": "p"`, http.StatusBadRequest,
			`{"error":"not JSON or YAML: yaml: line 1: did not find expected ',' or '}'","reason":"BadRequest"}`},
		{"malformed YAML", http.MethodPost, pathPods, "spec: [", http.StatusBadRequest,
			`{"error":"not JSON or YAML: yaml: line 1: did not find expected node content","reason":"BadRequest"}`},
		{"duplicate field", http.MethodPost, pathPods, "metadata: {name: p}\nmetadata: {name: q}\n", http.StatusBadRequest,
			`{"error":"not JSON or YAML: yaml: unmarshal errors:\n  line 2: key \"metadata\" already set in map","reason":"BadRequest"}`},
		{"field of the wrong type", http.MethodPost, pathPods, `{"spec": {"containers": 1}}`, http.StatusBadRequest,
			`{"error":"not a Pod: spec.containers is a number, want a list","reason":"BadRequest"}`},
		{"unknown field", http.MethodPost, pathPods, "spec:\n  containers:\n  - name: c\n    resource: {}\n", http.StatusBadRequest,
			`{"error":"not a Pod: unknown field \"resource\"","reason":"BadRequest"}`},
		{"too many containers", http.MethodPost, pathPods, manyContainers(maxPodContainers + 1), http.StatusUnprocessableEntity,
			`{"error":"invalid pod: the pod has 1001 containers (init and app together); devmgr admits at most 1000","reason":"InvalidPod"}`},
		{"kind", http.MethodPost, pathPods, "kind: Deployment", http.StatusUnprocessableEntity,
			`{"error":"invalid pod: kind is \"Deployment\", want Pod","reason":"InvalidPod"}`},
		{"no containers", http.MethodPost, pathPods, "metadata: {name: p}", http.StatusUnprocessableEntity,
			`{"error":"invalid pod: spec.containers is empty","reason":"InvalidPod"}`},
		{"apiVersion", http.MethodPost, pathPods, "apiVersion: apps/v1\nkind: Pod", http.StatusUnprocessableEntity,
			`{"error":"invalid pod: apiVersion is \"apps/v1\", want v1","reason":"InvalidPod"}`},
		{"fractional devices", http.MethodPost, pathPods, pod("half", `"example.com/gpu":"500m"`), http.StatusUnprocessableEntity,
			`{"error":"invalid pod: container \"c\": the limit of example.com/gpu must be a whole number, not 500m","reason":"InvalidPod"}`},
		{"devices short", http.MethodPost, pathPods, pod("short", `"example.com/gpu":2`), http.StatusConflict,
			`{"error":"requested number of devices unavailable for example.com/gpu. Requested: 2, Available: 1","container":"c","reason":"DevicesUnavailable"}`},
		{"request changed", http.MethodPost, pathPods, pod("held", `"example.com/gpu":2`), http.StatusUnprocessableEntity,
			`{"error":"pod held is already admitted with other containers or device requests; release it first","reason":"RequestChanged"}`},
		{"unknown path", http.MethodGet, "/v2/status", "", http.StatusNotFound,
			`{"error":"no such path /v2/status; the API serves /v1/status and /v1/pods","reason":"NotFound"}`},
		{"unknown pod", http.MethodGet, pathPods + "/nope", "", http.StatusNotFound,
			`{"error":"pod \"nope\" is not admitted","reason":"NotFound"}`},
		{"release unknown pod", http.MethodDelete, pathPods + "/nope", "", http.StatusNotFound,
			`{"error":"pod \"nope\" is not admitted","reason":"NotFound"}`},
		{"method", http.MethodPut, pathPods, "", http.StatusMethodNotAllowed,
			`{"error":"method PUT is not allowed on /v1/pods; use GET or POST","reason":"MethodNotAllowed"}`},
		{"status is read-only", http.MethodPost, pathStatus, "", http.StatusMethodNotAllowed,
			`{"error":"method POST is not allowed on /v1/status; use GET","reason":"MethodNotAllowed"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.expect(t, tc.method, tc.path, tc.body, tc.code, tc.want)
		})
	}

	t.Run("oversized bodies", func(t *testing.T) {
		want := fmt.Sprintf(`{"error":"the request body is larger than %d bytes (4 MiB), the most a pod may take","reason":"RequestEntityTooLarge"}`, maxPodBytes)
		// Said by its length, refused before it is read.
		h.expect(t, http.MethodPost, pathPods, strings.Repeat("#", maxPodBytes+1), http.StatusRequestEntityTooLarge, want)
		// Sent without a length, refused once the limit is read.
		req, err := http.NewRequest(http.MethodPost, h.api.base+pathPods, io.MultiReader(strings.NewReader(strings.Repeat("#", maxPodBytes+1))))
		require.NoError(t, err)
		require.Zero(t, req.ContentLength, "a length the client does not know: the body goes chunked")
		resp, err := h.api.client.Do(req)
		require.NoError(t, err)
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, resp.Body.Close())
		require.NoError(t, err)
		assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		assert.JSONEq(t, want, string(raw))
	})

	t.Run("the most containers a pod may have", func(t *testing.T) {
		code, raw := h.api.do(http.MethodPost, pathPods, []byte(manyContainers(maxPodContainers)))
		require.Equal(t, http.StatusOK, code, string(raw))
		code, raw = h.api.do(http.MethodDelete, pathPods+"/many", nil)
		require.Equal(t, http.StatusOK, code, string(raw))
	})

	t.Run("plugin failure", func(t *testing.T) {
		h.plugin.SetError(plugintest.MethodAllocate, status.Error(codes.Internal, "device on fire"))
		defer h.plugin.SetError(plugintest.MethodAllocate, nil)
		code, raw := h.api.do(http.MethodPost, pathPods, []byte(pod("fire", `"example.com/gpu":1`)))
		assert.Equal(t, http.StatusBadGateway, code)
		assert.Contains(t, string(raw), `"error": "device plugin Allocate rpc for example.com/gpu failed: `)
		assert.Contains(t, string(raw), "device on fire")
		assert.Contains(t, string(raw), `"reason": "PluginFailed"`)
	})

	t.Run("the pods cannot be saved", func(t *testing.T) {
		h.failRecord.Store(true)
		defer h.failRecord.Store(false)
		h.expect(t, http.MethodPost, pathPods, pod("unsaved", `"example.com/gpu":1`), http.StatusInternalServerError,
			`{"error":"admission undone: save admitted pods: no space left on device","reason":"Internal"}`)
		_, found := h.admitter.Pod("unsaved")
		assert.False(t, found, "a pod that would not survive a restart holds nothing")
		h.expect(t, http.MethodDelete, pathPods+"/held", "", http.StatusInternalServerError,
			`{"error":"pod held released, but it comes back after a restart: save admitted pods: no space left on device","reason":"Internal"}`)
	})

	st := h.mgr.Status()
	assert.Equal(t, 0, st[0].Allocated, "failed admissions hold nothing")
	assert.Empty(t, h.admitter.ActivePods())
}

// With --require-plugin, a resource no plugin registered fails admission, as
// the kubelet's plugin-only resources do; without it, it is ignored.
func TestControlAPIRequirePlugin(t *testing.T) {
	h := newControlHarness(t, gpus(1), func(o *devicemanager.Options) { o.RequirePlugin = []string{"example.com/*"} })
	h.expect(t, http.MethodPost, pathPods,
		`{"metadata":{"uid":"u"},"spec":{"containers":[{"name":"c","resources":{"limits":{"example.com/fpga":1}}}]}}`,
		http.StatusConflict, `{"error":"cannot allocate unregistered device example.com/fpga","container":"c","reason":"DevicesUnavailable"}`)
	h.expect(t, http.MethodPost, pathPods,
		`{"metadata":{"uid":"v"},"spec":{"containers":[{"name":"c","resources":{"limits":{"other.org/fpga":1}}}]}}`,
		http.StatusOK, `{"pod":{"uid":"v","name":"","namespace":"default"},"containers":[{"name":"c","devices":{},
		"runOptions":{"envs":[],"mounts":[],"devices":[],"annotations":[],"cdiDevices":[]}}]}`)
}

// Every failure the manager or the node reports maps to a status code and a
// reason, keeping the manager's message and naming the container.
func TestAdmissionErrorCodes(t *testing.T) {
	in := func(err error) error {
		return &podadmit.AdmitError{Container: "c", Err: fmt.Errorf("%w: the kubelet's words", err)}
	}
	for _, tc := range []struct {
		err    error
		code   int
		reason string
	}{
		{fmt.Errorf("%w: no containers", podadmit.ErrInvalidPod), http.StatusUnprocessableEntity, reasonInvalidPod},
		{in(devicemanager.ErrRequestChanged), http.StatusUnprocessableEntity, reasonRequestChanged},
		{in(devicemanager.ErrInsufficientDevices), http.StatusConflict, reasonDevicesUnavailable},
		{in(devicemanager.ErrNoHealthyDevices), http.StatusConflict, reasonDevicesUnavailable},
		{in(devicemanager.ErrAllocatedDeviceUnhealthy), http.StatusConflict, reasonDevicesUnavailable},
		{in(devicemanager.ErrUnregisteredResource), http.StatusConflict, reasonDevicesUnavailable},
		{fmt.Errorf("pod u is being admitted: %w", podadmit.ErrAdmissionInProgress), http.StatusConflict, reasonAdmissionInProgress},
		{in(devicemanager.ErrPluginCall), http.StatusBadGateway, reasonPluginFailed},
		{in(devicemanager.ErrEndpointStopped), http.StatusServiceUnavailable, reasonPluginUnavailable},
		{in(devicemanager.ErrUnknownPlugin), http.StatusServiceUnavailable, reasonPluginUnavailable},
		{in(devicemanager.ErrStopped), http.StatusServiceUnavailable, reasonPluginUnavailable},
		{in(devicemanager.ErrPluginNotReady), http.StatusServiceUnavailable, reasonPluginNotReady},
		{&podadmit.AdmitError{Container: "c", Err: fmt.Errorf("not back: %w", errors.Join(devicemanager.ErrPluginNotReady, context.Canceled))},
			http.StatusServiceUnavailable, reasonPluginNotReady},
		{in(context.DeadlineExceeded), http.StatusGatewayTimeout, reasonTimeout},
		{errors.New("something else"), http.StatusInternalServerError, reasonInternal},
	} {
		code, resp := admissionError(tc.err)
		assert.Equal(t, tc.code, code, "%v", tc.err)
		assert.Equal(t, tc.reason, resp.Reason, "%v", tc.err)
		var ae *podadmit.AdmitError
		if errors.As(tc.err, &ae) {
			assert.Equal(t, "c", resp.Container)
			assert.Equal(t, ae.Err.Error(), resp.Error, "the message is the manager's, without the container")
		} else {
			assert.Empty(t, resp.Container)
			assert.Equal(t, tc.err.Error(), resp.Error)
		}
	}
}

// A refusal names the pod by what it was sent with: a pod without a name or
// a UID is not logged as pod="default/" podUID="".
func TestControlAPILogsThePodAsSent(t *testing.T) {
	h := newControlHarness(t, gpus(1))
	var logs syncBuffer
	cs := &controlServer{status: h.mgr.Status, admitter: h.admitter, log: textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&logs)))}
	srv := httptest.NewServer(cs.handler())
	t.Cleanup(srv.Close)
	api := newAPIClient(t, srv.URL)

	code, raw := api.do(http.MethodPost, pathPods, []byte(`{}`))
	require.Equal(t, http.StatusUnprocessableEntity, code, string(raw))
	code, raw = api.do(http.MethodPost, pathPods, []byte(`{"metadata":{"name":"p","uid":"u1"}}`))
	require.Equal(t, http.StatusUnprocessableEntity, code, string(raw))
	code, raw = api.do(http.MethodPost, pathPods, []byte(`{"spec":{"containers":[{"name":"c"}]}}`))
	require.Equal(t, http.StatusOK, code, string(raw))

	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	require.Len(t, lines, 3, logs.String())
	assert.Contains(t, lines[0], `"Refused pod" err="invalid pod: spec.containers is empty"`)
	assert.NotContains(t, lines[0], "pod=", "no name, no pod")
	assert.NotContains(t, lines[0], "podUID=", "no UID, no podUID")
	assert.Contains(t, lines[1], `pod="default/p" podUID="u1"`)
	assert.Regexp(t, `"Admitted pod" podUID="[0-9a-f-]{36}" devices=\[\]`, lines[2], "the UID Admit generated")
	assert.NotContains(t, lines[2], "pod=")
}
