package main

import (
	"context"
	"errors"
	"fmt"
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
	gotCode, raw := h.api.do(method, path, []byte(body))
	assert.Equal(t, code, gotCode, "%s %s: %s", method, path, raw)
	assert.JSONEq(t, wantJSON, string(raw), "%s %s", method, path)
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
		{"empty body", http.MethodPost, pathPods, "", http.StatusUnprocessableEntity,
			`{"error":"no pod: the request body is empty; send a Pod as JSON or YAML","reason":"InvalidPod"}`},
		{"no containers", http.MethodPost, pathPods, "metadata: {name: p}", http.StatusUnprocessableEntity,
			`{"error":"invalid pod: spec.containers is empty","reason":"InvalidPod"}`},
		{"apiVersion", http.MethodPost, pathPods, "apiVersion: apps/v1\nkind: Pod", http.StatusUnprocessableEntity,
			`{"error":"apiVersion is \"apps/v1\", want v1","reason":"InvalidPod"}`},
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

	t.Run("malformed and oversized bodies", func(t *testing.T) {
		for body, want := range map[string]string{
			"spec: [":                          "not a Pod in JSON or YAML: ",
			`{"spec": {"containers": 1}}`:      "not a Pod in JSON or YAML: ",
			strings.Repeat("#", maxPodBytes+1): fmt.Sprintf("the pod is larger than %d bytes", maxPodBytes),
		} {
			code, raw := h.api.do(http.MethodPost, pathPods, []byte(body))
			assert.Equal(t, http.StatusUnprocessableEntity, code)
			assert.Contains(t, string(raw), want)
			assert.Contains(t, string(raw), `"reason": "InvalidPod"`)
		}
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
