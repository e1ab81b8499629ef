package devicemanager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/plugintest"
)

const (
	res1 = "domain1.com/resource1"
	res2 = "domain2.com/resource2"
)

func TestNewManagerImplValidatesOptions(t *testing.T) {
	for _, o := range []Options{
		{SocketDir: "relative/dir"},
		{SocketDir: "/abs", CheckpointDir: "rel"},
		{SocketDir: "/" + string(make([]byte, 120))},
		{SocketDir: "/abs", NUMANodes: []int{64}},
		{SocketDir: "/abs", RequirePlugin: []string{"a*/b"}},
	} {
		_, err := NewManagerImpl(o)
		assert.Error(t, err, "%+v", o)
	}
	dir := filepath.Join(t.TempDir(), "not-yet")
	m, err := NewManagerImpl(Options{SocketDir: dir})
	require.NoError(t, err)
	_, err = os.Stat(dir)
	assert.ErrorIs(t, err, os.ErrNotExist, "NewManagerImpl touches no files")
	require.NoError(t, m.Stop(), "Stop before Start")

	d, err := NewManagerImpl(Options{})
	require.NoError(t, err)
	assert.Equal(t, pluginapi.DevicePluginPath, d.opts.SocketDir)
	assert.Equal(t, pluginapi.DevicePluginPath, d.opts.CheckpointDir)
	assert.Equal(t, DefaultStopGracePeriod, d.opts.StopGracePeriod)
	assert.Equal(t, 64<<20, d.opts.MaxRecvMsgSize)
}

// Start, register a plugin, stop; a second Stop is fine and every goroutine
// is gone (goleak in TestMain).
func TestStartRegisterStop(t *testing.T) {
	h := newHarness(t).start()
	require.NoError(t, h.m.HealthCheck())
	info, err := os.Stat(h.dir)
	require.NoError(t, err)
	assert.True(t, info.IsDir())

	p := h.registered(res1, devices("dev", 2))
	assert.Len(t, p.CallsOf(plugintest.MethodGetDevicePluginOptions), 1)

	require.NoError(t, h.m.Stop())
	require.NoError(t, h.m.Stop())
	_, err = os.Stat(h.kubeletSocket())
	assert.ErrorIs(t, err, os.ErrNotExist, "kubelet.sock removed")
	require.ErrorIs(t, h.m.HealthCheck(), ErrStopped)
	require.ErrorIs(t, h.m.Allocate(context.Background(), newPod("p"), &v1ctr), ErrStopped)
	_, ok := <-h.m.Updates()
	assert.False(t, ok, "Updates is closed by Stop")
	// Getters still answer.
	c, a := h.capacity(res1)
	assert.Equal(t, int64(2), c)
	assert.Equal(t, int64(0), a, "stopped plugin: nothing allocatable")
}

func TestStartTwiceAndAfterStop(t *testing.T) {
	h := newHarness(t).start()
	assert.Error(t, h.m.Start(nil, nil, nil, nil))
	require.NoError(t, h.m.Stop())
	assert.ErrorIs(t, h.m.Start(nil, nil, nil, nil), ErrStopped)
}

func TestAllocateAndRunOptions(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 2))
	pod := newPod("pod-a", ctr("app", res1, 2, "cpu", 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	assert.Equal(t, []string{"dev0", "dev1"}, h.held(pod, "app", res1))

	opts, err := h.m.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
	require.NoError(t, err)
	require.NotNil(t, opts)
	assert.Len(t, opts.Devices, 2)
	assert.Len(t, opts.Mounts, 2)
	assert.Len(t, opts.Envs, 1)

	other := newPod("pod-b", ctr("app", res1, 1))
	h.pods.add(other)
	err = h.admit(other)
	require.ErrorIs(t, err, ErrInsufficientDevices)
	assert.EqualError(t, err, "requested number of devices unavailable for domain1.com/resource1. Requested: 1, Available: 0")

	// The checkpoint holds the allocation.
	store, err := checkpoint.NewManager(h.dir)
	require.NoError(t, err)
	data := checkpoint.New(nil, nil)
	require.NoError(t, store.GetCheckpoint(checkpoint.DeviceManagerKey, data))
	entries, registered := data.GetData()
	require.Len(t, entries, 1)
	assert.Equal(t, checkpoint.DevicesPerNUMA{-1: {"dev0", "dev1"}}, entries[0].DeviceIDs)
	assert.Equal(t, map[string][]string{res1: {"dev0", "dev1"}}, registered)
}

var v1ctr = ctr("c", res1, 1)

var _ = errors.New

// The registration socket is never world-writable, whatever the umask; the
// socket directory is 0750 and the checkpoint 0600.
func TestPermissions(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	h := newHarness(t)
	require.NoError(t, os.Remove(h.dir))
	h.start()
	info, err := os.Stat(h.dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o750), info.Mode().Perm())
	info, err = os.Stat(h.kubeletSocket())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o660), info.Mode().Perm())
	h.registered(res1, devices("d", 1))
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	info, err = os.Stat(filepath.Join(h.dir, checkpoint.DeviceManagerKey))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
}

// What the checkpoint holds for a pod the active pods do not list (an
// admission a crash cut short) is released before Start returns, when the
// pod sources are ready; until they are, and when no pod list is given,
// nothing is released.
func TestStartReleasesWhatInactivePodsHeld(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("d", 4))
	kept := newPod("kept", ctr("c", res1, 1))
	cut := newPod("cut", ctr("c", res1, 2))
	h.pods.add(kept, cut)
	require.NoError(t, h.admit(kept))
	require.NoError(t, h.admit(cut))
	h.pods.remove(cut.UID)
	require.NoError(t, h.m.Stop())

	startWith := func(active ActivePodsFunc, ready SourcesReady) *ManagerImpl {
		m := h.newManager()
		require.NoError(t, m.Start(active, ready, nil, nil))
		require.NoError(t, m.Stop())
		return m
	}
	notReady := &readyFlag{}
	for name, m := range map[string]*ManagerImpl{
		"sources not ready": startWith(h.pods.get, notReady),
		"no pod list":       startWith(nil, nil),
	} {
		assert.Len(t, m.GetDevices("cut", "c")[res1], 2, "%s: nothing is released", name)
		assert.Len(t, m.GetDevices("kept", "c")[res1], 1, name)
	}
	for name, m := range map[string]*ManagerImpl{
		"sources ready":    startWith(h.pods.get, h.ready),
		"sourcesReady nil": startWith(h.pods.get, nil),
	} {
		assert.Empty(t, m.GetDevices("cut", "c"), "%s: the inactive pod's devices are released", name)
		assert.Len(t, m.GetDevices("kept", "c")[res1], 1, "%s: the active pod keeps its device", name)
	}

	// A manager whose sources become ready later releases them when asked.
	m := h.newManager()
	require.NoError(t, m.Start(h.pods.get, notReady, nil, nil))
	assert.Len(t, m.GetDevices("cut", "c")[res1], 2)
	notReady.set(true)
	m.UpdateAllocatedDevices()
	assert.Empty(t, m.GetDevices("cut", "c"))
	assert.Len(t, m.GetDevices("kept", "c")[res1], 1)
}
