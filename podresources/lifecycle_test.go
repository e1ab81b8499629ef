package podresources_test

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/podresources"
)

var noPods = podresources.PodsFunc(func() []*v1.Pod { return nil })

// shortDir returns a fresh directory short enough for socket paths.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pr")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func newServer(t *testing.T, devices podresources.DeviceSource, opts podresources.Options) *podresources.Server {
	t.Helper()
	opts.Logger = ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(4)))
	srv, err := podresources.NewServer(devices, noPods, opts)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, srv.Stop()) })
	return srv
}

// staleSocket leaves a unix socket at path that nothing serves.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
}

// blockingDevices blocks GetAllocatableDevices until release is closed.
type blockingDevices struct {
	fakeDevices
	entered chan struct{}
	release chan struct{}
}

func (b blockingDevices) GetAllocatableDevices() devicemanager.ResourceDeviceInstances {
	close(b.entered)
	<-b.release
	return nil
}

type flagLimiter struct{ refuse atomic.Bool }

func (l *flagLimiter) Allow() bool { return !l.refuse.Load() }

func TestServerLifecycle(t *testing.T) {
	t.Run("NewServer validates its arguments", func(t *testing.T) {
		for name, f := range map[string]func() (*podresources.Server, error){
			"no devices": func() (*podresources.Server, error) {
				return podresources.NewServer(nil, noPods, podresources.Options{})
			},
			"no pods": func() (*podresources.Server, error) {
				return podresources.NewServer(fakeDevices{}, nil, podresources.Options{})
			},
			"negative recv": func() (*podresources.Server, error) {
				return podresources.NewServer(fakeDevices{}, noPods, podresources.Options{MaxRecvMsgSize: -1})
			},
			"negative send": func() (*podresources.Server, error) {
				return podresources.NewServer(fakeDevices{}, noPods, podresources.Options{MaxSendMsgSize: -1})
			},
		} {
			srv, err := f()
			assert.Error(t, err, name)
			assert.Nil(t, srv, name)
		}
	})

	t.Run("Stop before Start, twice; no Start after Stop", func(t *testing.T) {
		srv := newServer(t, fakeDevices{}, podresources.Options{})
		require.NoError(t, srv.Stop())
		require.NoError(t, srv.Stop())
		assert.ErrorIs(t, srv.Start(filepath.Join(shortDir(t), "s.sock")), podresources.ErrStopped)
		assert.Empty(t, srv.SocketPath())
	})

	t.Run("serves until Stop, then removes its socket", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "new", "dir", "s.sock") // directories created
		srv := newServer(t, fakeDevices{}, podresources.Options{})
		require.NoError(t, srv.Start(path))
		assert.Equal(t, path, srv.SocketPath())
		assert.ErrorIs(t, srv.Start(path), podresources.ErrStarted)
		client := dial(t, path)
		_, err := client.List(callCtx(t), &podresourcesv1.ListPodResourcesRequest{})
		require.NoError(t, err)

		require.NoError(t, srv.Stop())
		assert.NoFileExists(t, path)
		_, err = client.List(callCtx(t), &podresourcesv1.ListPodResourcesRequest{}, grpc.WaitForReady(false))
		assert.Equal(t, codes.Unavailable, status.Code(err), "call after Stop: %v", err)
		require.NoError(t, srv.Stop())
		assert.ErrorIs(t, srv.Start(path), podresources.ErrStopped)
	})

	t.Run("a stale socket is replaced", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "s.sock")
		staleSocket(t, path)
		srv := newServer(t, fakeDevices{}, podresources.Options{})
		require.NoError(t, srv.Start(path))
		_, err := dial(t, path).Get(callCtx(t), &podresourcesv1.GetPodResourcesRequest{PodName: "x"})
		assert.Equal(t, codes.NotFound, status.Code(err), "served by the new server: %v", err)
	})

	t.Run("a path that is not a socket is refused and kept", func(t *testing.T) {
		dir := shortDir(t)
		file := filepath.Join(dir, "file")
		require.NoError(t, os.WriteFile(file, []byte("keep"), 0o600))
		sub := filepath.Join(dir, "sub")
		require.NoError(t, os.Mkdir(sub, 0o750))
		srv := newServer(t, fakeDevices{}, podresources.Options{})
		for _, path := range []string{file, sub} {
			assert.ErrorIs(t, srv.Start(path), podresources.ErrNotSocket, path)
		}
		assert.FileExists(t, file)
		assert.DirExists(t, sub)
		// Nothing was started: another path still works.
		require.NoError(t, srv.Start(filepath.Join(dir, "s.sock")))
	})

	t.Run("a socket in use is refused", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "s.sock")
		first := newServer(t, fakeDevices{}, podresources.Options{})
		require.NoError(t, first.Start(path))
		second := newServer(t, fakeDevices{}, podresources.Options{})
		assert.ErrorIs(t, second.Start(path), podresources.ErrSocketInUse)
		require.NoError(t, second.Stop())
		_, err := dial(t, path).List(callCtx(t), &podresourcesv1.ListPodResourcesRequest{})
		assert.NoError(t, err, "the first server still serves")
	})

	t.Run("bad paths", func(t *testing.T) {
		dir := shortDir(t)
		blocker := filepath.Join(dir, "blocker")
		require.NoError(t, os.WriteFile(blocker, nil, 0o600))
		srv := newServer(t, fakeDevices{}, podresources.Options{})
		for _, path := range []string{
			"",
			"/" + strings.Repeat("x", 110),
			filepath.Join(blocker, "s.sock"), // its directory cannot be created
		} {
			assert.Error(t, srv.Start(path), path)
		}
		assert.Empty(t, srv.SocketPath())
	})

	t.Run("Stop leaves a file that replaced its socket", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "s.sock")
		srv := newServer(t, fakeDevices{}, podresources.Options{})
		require.NoError(t, srv.Start(path))
		require.NoError(t, os.Remove(path))
		require.NoError(t, os.WriteFile(path, []byte("someone else's"), 0o600))
		require.NoError(t, srv.Stop())
		assert.FileExists(t, path)
	})

	t.Run("Stop after its socket was removed by someone else", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "s.sock")
		srv := newServer(t, fakeDevices{}, podresources.Options{})
		require.NoError(t, srv.Start(path))
		require.NoError(t, os.Remove(path))
		assert.NoError(t, srv.Stop())
	})

	t.Run("Stop waits for calls in progress", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "s.sock")
		src := blockingDevices{entered: make(chan struct{}), release: make(chan struct{})}
		srv := newServer(t, src, podresources.Options{})
		require.NoError(t, srv.Start(path))
		client := dial(t, path)
		ctx := callCtx(t)
		callErr := make(chan error, 1)
		go func() {
			_, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
			callErr <- err
		}()
		<-src.entered
		stopped := make(chan error, 1)
		go func() { stopped <- srv.Stop() }()
		select {
		case err := <-stopped:
			t.Fatalf("Stop returned (%v) while a call was in progress", err)
		default:
		}
		close(src.release)
		select {
		case err := <-stopped:
			require.NoError(t, err)
		case <-time.After(waitTimeout):
			t.Fatal("Stop did not return after the call ended")
		}
		// The call fails or, when it ended before Stop closed its connection,
		// succeeds: either way it has ended.
		t.Logf("the call ended with %v", <-callErr)
	})

	t.Run("an embedder registers the service on its own server", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "s.sock")
		srv := newServer(t, fakeDevices{alloc: devicemanager.ResourceDeviceInstances{gpu: {"g": nil}}}, podresources.Options{})
		g := grpc.NewServer()
		srv.Register(g)
		l, err := net.Listen("unix", path)
		require.NoError(t, err)
		var wg sync.WaitGroup
		wg.Go(func() { assert.NoError(t, g.Serve(l)) })
		defer func() { g.Stop(); wg.Wait() }()

		alloc, err := dial(t, path).GetAllocatableResources(callCtx(t), &podresourcesv1.AllocatableResourcesRequest{})
		require.NoError(t, err)
		assertProto(t, &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{dev(gpu, "g", -1)}}, alloc, "embedded")
		assert.Empty(t, srv.SocketPath(), "Register does not Start")
	})

	t.Run("the limiter refuses calls with the kubelet's error", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "s.sock")
		lim := &flagLimiter{}
		srv := newServer(t, fakeDevices{}, podresources.Options{Limiter: lim})
		require.NoError(t, srv.Start(path))
		client := dial(t, path)
		ctx := callCtx(t)
		calls := map[string]func() error{
			"List": func() error {
				_, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
				return err
			},
			"GetAllocatableResources": func() error {
				_, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
				return err
			},
			"Get": func() error {
				_, err := client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{})
				return err
			},
		}
		for name, call := range calls {
			lim.refuse.Store(true)
			err := call()
			assert.Equal(t, codes.ResourceExhausted, status.Code(err), name)
			assert.Equal(t, "rejected by rate limit", status.Convert(err).Message(), name)
			lim.refuse.Store(false)
			if err := call(); name == "Get" {
				assert.Equal(t, codes.NotFound, status.Code(err), name)
			} else {
				assert.NoError(t, err, name)
			}
		}
	})
}

// The socket is created 0660 whatever the umask (no moment at another mode,
// no chmod afterwards). The umask is the whole process's: no test in this
// package runs in parallel, and this one restores it.
func TestSocketModeUnderEveryUmask(t *testing.T) {
	for _, mask := range []int{0o000, 0o022, 0o077} {
		t.Run(fmt.Sprintf("umask %04o", mask), func(t *testing.T) {
			old := syscall.Umask(mask)
			defer syscall.Umask(old)
			path := filepath.Join(shortDir(t), "s.sock")
			srv := newServer(t, fakeDevices{}, podresources.Options{})
			require.NoError(t, srv.Start(path))
			fi, err := os.Lstat(path)
			require.NoError(t, err)
			assert.Equal(t, fs.ModeSocket, fi.Mode().Type())
			assert.Equal(t, "0660", fmt.Sprintf("%04o", uint32(fi.Mode().Perm())))
			assert.Equal(t, mask, syscall.Umask(mask), "Start changed the process's umask")
		})
	}
}
