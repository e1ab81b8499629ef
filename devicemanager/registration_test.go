package devicemanager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/internal/pluginreg"
	"github.com/openkubelet/devmgr/plugintest"
)

// Malformed registrations are refused with a clear error, and the manager
// keeps serving a good plugin throughout.
func TestRegisterRefusesBadRequests(t *testing.T) {
	h := newHarness(t).start()
	p := h.plugin(res1, devices("dev", 1), func(o *plugintest.Options) { o.Endpoint = "good.sock" })
	regular := filepath.Join(h.dir, "regular")
	require.NoError(t, os.WriteFile(regular, nil, 0o600))

	tests := []struct {
		name   string
		mutate func(*pluginapi.RegisterRequest)
		want   string
	}{
		{"empty version", func(r *pluginapi.RegisterRequest) { r.Version = "" }, `requested API version "" is not supported by kubelet. Supported version is ["v1beta1"]`},
		{"old version", func(r *pluginapi.RegisterRequest) { r.Version = "v1alpha" }, `requested API version "v1alpha" is not supported`},
		{"no domain", func(r *pluginapi.RegisterRequest) { r.ResourceName = "gpu" }, `the ResourceName "gpu" is invalid`},
		{"kubernetes.io domain", func(r *pluginapi.RegisterRequest) { r.ResourceName = "kubernetes.io/gpu" }, `the ResourceName "kubernetes.io/gpu" is invalid`},
		{"kubernetes.io subdomain", func(r *pluginapi.RegisterRequest) { r.ResourceName = "a.kubernetes.io/gpu" }, "is invalid"},
		{"requests. prefix", func(r *pluginapi.RegisterRequest) { r.ResourceName = "requests.example.com/gpu" }, "is invalid"},
		{"two slashes", func(r *pluginapi.RegisterRequest) { r.ResourceName = "example.com/a/b" }, "is invalid"},
		{"upper-case domain", func(r *pluginapi.RegisterRequest) { r.ResourceName = "Example.com/gpu" }, "is invalid"},
		{"empty name", func(r *pluginapi.RegisterRequest) { r.ResourceName = "example.com/" }, "is invalid"},
		{"name too long", func(r *pluginapi.RegisterRequest) { r.ResourceName = "example.com/" + strings.Repeat("g", 64) }, "is invalid"},
		{"bad name character", func(r *pluginapi.RegisterRequest) { r.ResourceName = "example.com/gp u" }, "is invalid"},
		{"empty endpoint", func(r *pluginapi.RegisterRequest) { r.Endpoint = "" }, `invalid endpoint ""`},
		{"dot endpoint", func(r *pluginapi.RegisterRequest) { r.Endpoint = "." }, `invalid endpoint "."`},
		{"dot-dot endpoint", func(r *pluginapi.RegisterRequest) { r.Endpoint = ".." }, `invalid endpoint ".."`},
		{"escaping endpoint", func(r *pluginapi.RegisterRequest) { r.Endpoint = "../../etc/passwd" }, "without '/' or NUL"},
		{"absolute endpoint", func(r *pluginapi.RegisterRequest) { r.Endpoint = p.SocketPath() }, "without '/' or NUL"},
		{"NUL in endpoint", func(r *pluginapi.RegisterRequest) { r.Endpoint = "a\x00b" }, "without '/' or NUL"},
		{"4 KiB endpoint", func(r *pluginapi.RegisterRequest) { r.Endpoint = strings.Repeat("e", 4096) }, "the limit is 107"},
		{"missing socket", func(r *pluginapi.RegisterRequest) { r.Endpoint = "missing.sock" }, "does not exist"},
		{"regular file", func(r *pluginapi.RegisterRequest) { r.Endpoint = "regular" }, "is not a unix socket"},
		{"the registration socket itself", func(r *pluginapi.RegisterRequest) { r.Endpoint = KubeletSocketName }, "failed to get device plugin options"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := p.RegisterRequest()
			tc.mutate(req)
			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			defer cancel()
			err := p.RegisterWith(ctx, h.kubeletSocket(), req)
			require.Error(t, err)
			assert.Contains(t, status.Convert(errors.Unwrap(err)).Message(), tc.want)
			assert.NoError(t, h.m.HealthCheck())
		})
	}
	c, _ := h.capacity(res1)
	assert.Equal(t, int64(-1), c, "nothing registered")
	h.register(p)
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
}

// A socket that answers but is not a device plugin is refused with its own
// answer (Unimplemented), not after waiting for the dial deadline.
func TestRegisterRefusesNonPlugin(t *testing.T) {
	h := newHarness(t).start()
	other := newHarness(t).start() // a manager serves Registration, not DevicePlugin
	link := filepath.Join(h.dir, "other.sock")
	require.NoError(t, os.Symlink(other.kubeletSocket(), link))
	p := h.plugin(res1, nil)
	req := p.RegisterRequest()
	req.Endpoint = "other.sock"
	err := p.RegisterWith(context.Background(), h.kubeletSocket(), req)
	require.Error(t, err)
	assert.Equal(t, codes.Unknown, status.Code(errors.Unwrap(err)))
	assert.Contains(t, err.Error(), "Unimplemented")
	assert.NotContains(t, err.Error(), "DeadlineExceeded")
}

// Start removes sockets left by a previous run, never regular files,
// directories or links, and reads the checkpoint first.
func TestStartRemovesOnlyStaleSockets(t *testing.T) {
	h := newHarness(t)
	keep := []string{"DEPRECATION", "notes.txt"}
	for _, f := range keep {
		require.NoError(t, os.WriteFile(filepath.Join(h.dir, f), []byte("x"), 0o600))
	}
	require.NoError(t, os.Mkdir(filepath.Join(h.dir, "subdir"), 0o750))
	old := h.plugin(res1, nil, func(o *plugintest.Options) { o.Endpoint = "stale.sock" })
	require.NoError(t, os.Symlink(old.SocketPath(), filepath.Join(h.dir, "link.sock")))
	h.start()
	_, err := os.Stat(old.SocketPath())
	assert.ErrorIs(t, err, os.ErrNotExist, "stale socket removed")
	for _, f := range append(keep, "subdir") {
		_, err := os.Stat(filepath.Join(h.dir, f))
		assert.NoError(t, err, f)
	}
	_, err = os.Lstat(filepath.Join(h.dir, "link.sock"))
	assert.NoError(t, err, "links are left alone")
	assert.False(t, h.m.ShouldResetExtendedResourceCapacity(), "the directory is not empty")
}

// A corrupt checkpoint is moved aside for inspection and Start goes on empty.
func TestStartMovesCorruptCheckpointAside(t *testing.T) {
	for _, fixture := range []string{"corrupt", "badjson", "legacy-v1"} {
		t.Run(fixture, func(t *testing.T) {
			h := newHarness(t)
			blob := h.installFixture(fixture)
			h.start()
			aside := filepath.Join(h.dir, checkpoint.DeviceManagerKey+".bad-"+itoa(h.clock.Now().Unix()))
			moved, err := os.ReadFile(aside)
			require.NoError(t, err)
			assert.Equal(t, blob, moved)
			_, err = os.Stat(filepath.Join(h.dir, checkpoint.DeviceManagerKey))
			assert.ErrorIs(t, err, os.ErrNotExist)
			assert.Nil(t, h.m.GetDevices("pod-uid-1", "ctr"), "nothing restored")
			c, _ := h.capacity("example.com/dev")
			assert.Equal(t, int64(-1), c)
		})
	}
}

// A kubelet-written checkpoint, current or pre-1.20, is restored.
func TestStartRestoresKubeletCheckpoint(t *testing.T) {
	for _, fixture := range []string{"sample", "legacy-v1-valid", "reformatted"} {
		t.Run(fixture, func(t *testing.T) {
			h := newHarness(t)
			h.installFixture(fixture)
			pod := newPod("pod-uid-1", ctr("ctr", "example.com/dev", 2))
			h.pods.add(pod) // the pod runs, or Start would release its devices
			h.start()
			view := h.m.GetDevices("pod-uid-1", "ctr")
			require.Contains(t, view, "example.com/dev")
			assert.ElementsMatch(t, []string{"dev-0", "dev-1"}, keysOf(view["example.com/dev"]))
			opts, err := h.m.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
			require.NoError(t, err)
			require.NotNil(t, opts)
			assert.Equal(t, []EnvVar{{Name: "A", Value: "1"}}, opts.Envs)
			c, a := h.capacity("example.com/dev")
			assert.Equal(t, []int64{0, 0}, []int64{c, a})
		})
	}
}

// A failing GetPreferredAllocation means "no preference": the pod is still
// admitted (NVIDIA k8s-device-plugin#231: one broken card failed every pod).
func TestFailingPreferredAllocationIsNoPreference(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 3), func(o *plugintest.Options) { o.GetPreferredAllocationAvailable = true })
	p.SetError(plugintest.MethodGetPreferredAllocation, status.Error(codes.Internal, "nvml: GPU is lost"))
	pod := newPod("p", ctr("app", res1, 2))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	assert.Len(t, p.CallsOf(plugintest.MethodGetPreferredAllocation), 1)
	assert.Len(t, h.held(pod, "app", res1), 2)
}

func TestWatcherHandlerValidation(t *testing.T) {
	h := newHarness(t).start()
	w := h.m.GetWatcherHandler()
	assert.NoError(t, w.ValidatePlugin(res1, "/x.sock", []string{"v1alpha1", "v1beta1"}))
	err := w.ValidatePlugin(res1, "/x.sock", []string{"v1alpha1"})
	assert.EqualError(t, err, "manager version, v1beta1, is not among plugin supported versions [v1alpha1]")
	err = w.ValidatePlugin("gpu", "/x.sock", []string{"v1beta1"})
	assert.EqualError(t, err, `invalid name of device plugin socket: the ResourceName "gpu" is invalid`)
	assert.ErrorContains(t, w.RegisterPlugin(res1, "relative.sock", nil, nil), "absolute")
	w.DeRegisterPlugin(res1, "/unknown.sock") // no-op

	p := h.plugin(res1, devices("d", 1))
	timeout := 5 * time.Second
	require.NoError(t, w.RegisterPlugin(res1, p.SocketPath(), []string{"v1beta1"}, &timeout))
	h.waitCapacity(res1, 1, 1)
	w.DeRegisterPlugin(res1, p.SocketPath())
	h.waitCapacity(res1, 1, 0)
}

func keysOf(m DeviceInstances) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// installFixture copies a kubelet-written checkpoint fixture into the
// harness directory and returns its bytes.
func (h *harness) installFixture(name string) []byte {
	h.t.Helper()
	blob, err := os.ReadFile(filepath.Join("../testdata/kubelet-checkpoints", name, checkpoint.DeviceManagerKey))
	require.NoError(h.t, err)
	require.NoError(h.t, os.WriteFile(filepath.Join(h.dir, checkpoint.DeviceManagerKey), blob, 0o600))
	return blob
}

// Two bad checkpoints within one second are both kept aside; temporary
// files of interrupted writes are removed at start.
func TestBadCheckpointsKeptAsideTwiceAndTempFilesRemoved(t *testing.T) {
	h := newHarness(t)
	first := h.installFixture("corrupt")
	h.start()
	require.NoError(t, h.m.Stop())
	require.NoError(t, os.Mkdir(filepath.Join(h.dir, checkpoint.DeviceManagerKey), 0o750))
	require.NoError(t, os.WriteFile(filepath.Join(h.dir, ".123456"), []byte("half a write"), 0o600))
	h.m = h.newManager() // same second on the fake clock
	require.NoError(t, h.m.Start(nil, nil, nil, nil))

	base := filepath.Join(h.dir, checkpoint.DeviceManagerKey+".bad-"+itoa(h.clock.Now().Unix()))
	kept, err := os.ReadFile(base)
	require.NoError(t, err)
	assert.Equal(t, first, kept, "the first bad file is not replaced")
	info, err := os.Stat(base + ".1")
	require.NoError(t, err)
	assert.True(t, info.IsDir(), "the directory in the checkpoint's place is kept aside too")
	_, err = os.Stat(filepath.Join(h.dir, ".123456"))
	assert.ErrorIs(t, err, os.ErrNotExist)

	// The path is free again: admissions write the checkpoint.
	h.registered(res1, devices("d", 1))
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
}

// A pod UID that is not UTF-8 is refused: the checkpoint could not carry it.
func TestAllocateRefusesInvalidUTF8(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("d", 1))
	pod := newPod("p\xff", ctr("app", res1, 1))
	h.pods.add(pod)
	err := h.admit(pod)
	require.ErrorIs(t, err, ErrInvalidRequest)
	assert.Nil(t, h.m.GetDevices("p\xff", "app"))
	err = h.m.Allocate(context.Background(), nil, nil)
	assert.ErrorIs(t, err, ErrInvalidRequest)
}

// A plugin whose dial-back completes after Stop is not adopted: connect
// finds the manager stopped once it takes the lock, stops the new endpoint
// and fails the registration, so no follower starts after Stop and the
// resource never appears. (The plugin-watcher path is the one where this can
// happen: Stop waits for registrations through kubelet.sock, their gRPC
// handlers, not for RegisterPlugin calls.)
func TestDialCompletedAfterStopDropsTheNewEndpoint(t *testing.T) {
	h := newHarness(t).start()
	p := h.plugin("example.com/gpu", devices("gpu", 2))
	require.NoError(t, h.m.Stop())

	err := h.m.connect(context.Background(), p.ResourceName(), p.SocketPath())
	require.ErrorIs(t, err, ErrStopped)
	c, _ := h.capacity("example.com/gpu")
	assert.Equal(t, int64(-1), c, "the resource of the dropped endpoint is not registered")
	assert.Len(t, p.CallsOf(plugintest.MethodGetDevicePluginOptions), 1, "the dial-back did reach the plugin")
	assert.Empty(t, p.CallsOf(plugintest.MethodListAndWatch), "no stream was opened to the dropped endpoint")
}

// An endpoint whose socket path is exactly the longest a unix socket takes
// is accepted.
func TestEndpointPathAtLimit(t *testing.T) {
	h := newHarness(t)
	ep := strings.Repeat("x", pluginreg.MaxSocketPath-len(h.opts.SocketDir)-1)
	path, err := pluginreg.EndpointPath(h.opts.SocketDir, ep)
	require.NoError(t, err)
	assert.Len(t, path, pluginreg.MaxSocketPath)
}

// A late message from an instance replaced by a re-registration on the same
// socket is ignored.
func TestStaleInstanceMessageIgnored(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 2))
	h.m.mu.Lock()
	old := h.m.core.resources[res1].primary
	h.m.mu.Unlock()
	h.register(p) // same socket: replaces old
	p.Update([]*pluginapi.Device{dev("dev0", healthy, 0), dev("dev1", healthy)})
	h.waitDeviceTopology(res1, "dev0", 0) // the new instance's stream is applied
	h.m.onDevices(res1, old, []*pluginapi.Device{dev("dev0", sick), dev("dev1", sick)})
	c, a := h.capacity(res1)
	assert.Equal(t, []int64{2, 2}, []int64{c, a})
}

// When the primary instance goes, the newest remaining one serves
// allocations.
func TestNewestRemainingInstancePromoted(t *testing.T) {
	h := newHarness(t).start()
	var ps []*plugintest.Plugin
	for _, n := range []string{"a.sock", "b.sock", "c.sock"} {
		ps = append(ps, h.registered(res1, devices("dev", 2), endpointName(n)))
	}
	ps[2].Stop()
	h.eventually(func() bool { return h.connections(res1) == 2 }, "c disconnected")
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	assert.Len(t, ps[1].CallsOf(plugintest.MethodAllocate), 1, "b, the newest left, is primary")
	assert.Empty(t, ps[0].CallsOf(plugintest.MethodAllocate))
}
