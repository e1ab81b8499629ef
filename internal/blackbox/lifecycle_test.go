package blackbox_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/internal/leakwait"
)

// NewManagerImpl refuses a relative directory and touches no file.
func TestNewManagerImplRejectsRelativeDirs(t *testing.T) {
	abs := tempDir(t)
	cases := []struct {
		name    string
		opts    devicemanager.Options
		wantErr bool
	}{
		{"relative socket dir", devicemanager.Options{SocketDir: "device-plugins"}, true},
		{"dot-relative socket dir", devicemanager.Options{SocketDir: "./x/y"}, true},
		{"relative checkpoint dir", devicemanager.Options{SocketDir: abs, CheckpointDir: "ckpt"}, true},
		{"absolute both", devicemanager.Options{SocketDir: abs, CheckpointDir: filepath.Join(abs, "ck")}, false},
		{"absolute socket dir only", devicemanager.Options{SocketDir: filepath.Join(abs, "s")}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := devicemanager.NewManagerImpl(tc.opts)
			if tc.wantErr {
				assert.Error(t, err)
				assert.Nil(t, m)
				return
			}
			require.NoError(t, err)
			require.NotNil(t, m)
			assert.NoError(t, m.Stop())
		})
	}
	// Nothing was created by construction.
	_, err := os.Stat(filepath.Join(abs, "ck"))
	assert.True(t, os.IsNotExist(err), "NewManagerImpl created the checkpoint dir")
	_, err = os.Stat(filepath.Join(abs, "s"))
	assert.True(t, os.IsNotExist(err), "NewManagerImpl created the socket dir")
}

func TestNewManagerImplDefaultsTouchNothing(t *testing.T) {
	_, statErr := os.Stat(pluginapi.DevicePluginPath)
	m, err := devicemanager.NewManagerImpl(devicemanager.Options{})
	require.NoError(t, err)
	assert.NoError(t, m.Stop())
	if os.IsNotExist(statErr) {
		_, err = os.Stat(pluginapi.DevicePluginPath)
		assert.True(t, os.IsNotExist(err), "NewManagerImpl created %s", pluginapi.DevicePluginPath)
	}
}

func TestStopBeforeStartAndIdempotent(t *testing.T) {
	e := newEnv(t, nil)
	m, err := devicemanager.NewManagerImpl(e.opts)
	require.NoError(t, err)
	assert.NoError(t, m.Stop())
	assert.NoError(t, m.Stop())

	m2 := e.start(t)
	assert.NoError(t, m2.Stop())
	assert.NoError(t, m2.Stop())
}

// Start creates SocketDir (0750) and CheckpointDir; kubelet.sock appears and
// Stop removes it.
func TestStartCreatesDirsAndSocketStopRemovesIt(t *testing.T) {
	root := tempDir(t)
	sockDir := filepath.Join(root, "a", "sock")
	ckDir := filepath.Join(root, "b", "ck")
	m, err := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: sockDir, CheckpointDir: ckDir})
	require.NoError(t, err)
	require.NoError(t, m.Start(nil, nil, nil, nil))
	defer func() { _ = m.Stop() }()

	st, err := os.Stat(sockDir)
	require.NoError(t, err)
	assert.True(t, st.IsDir())
	assert.Equal(t, os.FileMode(0o750), st.Mode().Perm(), "socket dir mode")
	st, err = os.Stat(ckDir)
	require.NoError(t, err)
	assert.True(t, st.IsDir())

	sock := filepath.Join(sockDir, "kubelet.sock")
	st, err = os.Stat(sock)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket, st.Mode().Type())
	assert.NoError(t, m.HealthCheck())

	require.NoError(t, m.Stop())
	_, err = os.Stat(sock)
	assert.True(t, os.IsNotExist(err), "kubelet.sock still present after Stop")
}

// makeStaleSocket leaves a unix socket file at path with no listener.
func makeStaleSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	l.SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
	st, err := os.Lstat(path)
	require.NoError(t, err)
	require.Equal(t, os.ModeSocket, st.Mode().Type())
}

func TestStartRemovesStaleSocketsKeepsFiles(t *testing.T) {
	e := newEnv(t, nil)
	makeStaleSocket(t, filepath.Join(e.dir, "old-plugin.sock"))
	makeStaleSocket(t, filepath.Join(e.dir, "kubelet.sock"))
	require.NoError(t, os.WriteFile(filepath.Join(e.dir, "DEPRECATION"), []byte("x"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(e.dir, "notes.sock"), []byte("regular file"), 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(e.dir, "subdir"), 0o750))
	makeStaleSocket(t, filepath.Join(e.dir, "subdir", "nested.sock"))

	e.start(t)

	_, err := os.Lstat(filepath.Join(e.dir, "old-plugin.sock"))
	assert.True(t, os.IsNotExist(err), "stale socket not removed")
	for _, keep := range []string{"DEPRECATION", "notes.sock", "subdir", filepath.Join("subdir", "nested.sock")} {
		_, err := os.Lstat(filepath.Join(e.dir, keep))
		assert.NoError(t, err, "%s was removed", keep)
	}
	// kubelet.sock was replaced by a live one: a plugin can register.
	p := newFakePlugin(t, e.dir, "p.sock", resGPU, nil, healthy("d0"))
	p.start(t)
	require.NoError(t, registerPlugin(t, e.dir, p))
	e.waitCapacity(t, resGPU, 1, 1)
}

// Every getter is safe before Start and after Stop, and answers "nothing".
func TestGettersBeforeStartAndAfterStop(t *testing.T) {
	e := newEnv(t, nil)
	m, err := devicemanager.NewManagerImpl(e.opts)
	require.NoError(t, err)
	p := pod("u1", ctr("c", resGPU, 1))
	st := &v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: "c"}}}

	check := func(m *devicemanager.ManagerImpl) {
		c, a, removed := m.GetCapacity()
		assert.Empty(t, c)
		assert.Empty(t, a)
		assert.Empty(t, removed)
		assert.Empty(t, m.GetDevices("u1", "c"))
		assert.Empty(t, m.GetAllocatableDevices())
		assert.Empty(t, m.GetTopologyHints(p, &p.Spec.Containers[0])[resGPU])
		assert.Empty(t, m.GetPodTopologyHints(p)[resGPU])
		m.UpdateAllocatedDevices()
		m.UpdateAllocatedResourcesStatus(p, st)
		_ = m.ShouldResetExtendedResourceCapacity()
		assert.NotNil(t, m.Updates())
		assert.NotNil(t, m.GetWatcherHandler())
		al := v1.ResourceList{}
		assert.Empty(t, m.UpdatePluginResources(al, p))
		opts, err := m.GetDeviceRunContainerOptions(context.Background(), p, &p.Spec.Containers[0])
		assert.NoError(t, err)
		assert.Nil(t, opts)
	}
	check(m)
	e.pods.set(p)
	require.NoError(t, m.Start(e.pods.get, e.ready, nil, nil))
	require.NoError(t, m.Stop())
	check(m)
}

// After Stop, admitting a device-plugin resource fails (the manager no longer
// serves); the error must not be nil.
func TestAllocateAfterStopFails(t *testing.T) {
	e := newEnv(t, nil)
	m := e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	require.NoError(t, m.Stop())
	p := pod("u1", ctr("c", resGPU, 1))
	e.pods.set(p)
	err := m.Allocate(context.Background(), p, &p.Spec.Containers[0])
	require.Error(t, err)
	assert.True(t, errorsIsAny(err, devicemanager.ErrStopped, devicemanager.ErrNoHealthyDevices),
		"after Stop: %v", err)
}

func TestHealthCheckWhileServing(t *testing.T) {
	e := newEnv(t, nil)
	m := e.start(t)
	assert.NoError(t, m.HealthCheck())
}

// ShouldResetExtendedResourceCapacity is true exactly when the checkpoint
// directory has no entry whose name does not start with a dot, as in the
// kubelet (so kubelet.sock in a shared directory counts).
func TestShouldResetExtendedResourceCapacity(t *testing.T) {
	t.Run("separate empty checkpoint dir", func(t *testing.T) {
		e := newEnv(t, func(o *devicemanager.Options) { o.CheckpointDir = filepath.Join(o.SocketDir, "ck") })
		m := e.start(t)
		assert.True(t, m.ShouldResetExtendedResourceCapacity())
		e.plugin(t, "p.sock", resGPU, nil, healthy("d0"))
		require.Eventually(t, func() bool {
			_, err := os.Stat(filepath.Join(e.opts.CheckpointDir, checkpoint.DeviceManagerKey))
			return err == nil
		}, waitFor, tick)
		assert.False(t, m.ShouldResetExtendedResourceCapacity())
		require.NoError(t, os.Remove(filepath.Join(e.opts.CheckpointDir, checkpoint.DeviceManagerKey)))
		assert.True(t, m.ShouldResetExtendedResourceCapacity())
		require.NoError(t, os.WriteFile(filepath.Join(e.opts.CheckpointDir, ".hidden"), nil, 0o600))
		assert.True(t, m.ShouldResetExtendedResourceCapacity(), "dot entries do not count")
	})
	t.Run("shared dir holds kubelet.sock", func(t *testing.T) {
		e := newEnv(t, nil)
		m := e.start(t)
		assert.False(t, m.ShouldResetExtendedResourceCapacity(), "kubelet.sock counts as an entry")
	})
}

func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// Start with nil arguments: no active pods, sources always ready, nothing
// running.
func TestStartNilArguments(t *testing.T) {
	dir := tempDir(t)
	m, err := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir})
	require.NoError(t, err)
	require.NoError(t, m.Start(nil, nil, nil, nil))
	defer func() { _ = m.Stop() }()
	pl := newFakePlugin(t, dir, "p.sock", resGPU, nil, healthy("d0"))
	pl.start(t)
	require.NoError(t, registerPlugin(t, dir, pl))
	require.Eventually(t, func() bool { _, a, _ := capacityOf(m, resGPU); return a == 1 }, waitFor, tick)
	p := pod("u1", ctr("c", resGPU, 1))
	require.NoError(t, m.Allocate(context.Background(), p, &p.Spec.Containers[0]))
	assert.Len(t, m.GetDevices("u1", "c")[resGPU], 1)
	m.UpdateAllocatedDevices() // no active pods, always ready: collected
	assert.Empty(t, m.GetDevices("u1", "c"))
}

// Stop while a plugin call hangs: Stop returns, the call fails, nothing leaks.
func TestStopDuringHungAllocate(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	e := newEnv(t, nil)
	m, err := devicemanager.NewManagerImpl(e.opts)
	require.NoError(t, err)
	require.NoError(t, m.Start(e.pods.get, e.ready, nil, nil))
	e.mgr = m
	pl := newFakePlugin(t, e.dir, "p.sock", resGPU, nil, healthy("d0"))
	pl.setAllocate(func(ctx context.Context, _ *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	pl.start(t)
	require.NoError(t, registerPlugin(t, e.dir, pl))
	e.waitCapacity(t, resGPU, 1, 1)

	res := make(chan error, 1)
	go func() { res <- e.allocate(pod("u1", ctr("c", resGPU, 1)), "c") }()
	require.Eventually(t, func() bool { return len(pl.allocateCalls()) == 1 }, waitFor, tick)
	stopped := make(chan struct{})
	go func() {
		_ = m.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(waitFor):
		t.Fatal("Stop blocked on a hung plugin call")
	}
	select {
	case err := <-res:
		assert.Error(t, err)
	case <-time.After(waitFor):
		t.Fatal("Allocate still hung after Stop")
	}
	require.Eventually(t, func() bool { return pl.openStreams() == 0 }, waitFor, tick, "Stop did not disconnect the plugin")
	pl.stop()
	leakwait.VerifyNone(t, waitFor, ignore)
}
