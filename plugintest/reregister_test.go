package plugintest

import (
	"context"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// restartingKubelet serves a fakeKubelet on dir/kubelet.sock and restarts as
// a kubelet does: stopping removes kubelet.sock, starting removes every
// socket in the directory (the plugins' too) and serves kubelet.sock anew.
type restartingKubelet struct {
	t      *testing.T
	k      *fakeKubelet
	path   string
	srv    *grpc.Server
	served chan error
}

func newRestartingKubelet(t *testing.T, dir string) *restartingKubelet {
	t.Helper()
	r := &restartingKubelet{
		t:    t,
		path: filepath.Join(dir, "kubelet.sock"),
		k: &fakeKubelet{
			dir:      dir,
			requests: make(chan *pluginapi.RegisterRequest, 10),
			options:  make(chan *pluginapi.DevicePluginOptions, 10),
		},
	}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *restartingKubelet) start() {
	r.t.Helper()
	entries, err := os.ReadDir(filepath.Dir(r.path))
	require.NoError(r.t, err)
	for _, e := range entries {
		if e.Type() == fs.ModeSocket {
			require.NoError(r.t, os.Remove(filepath.Join(filepath.Dir(r.path), e.Name())))
		}
	}
	lis, err := net.Listen("unix", r.path) // unlinked when the server stops
	require.NoError(r.t, err)
	r.srv = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(r.srv, r.k)
	r.served = make(chan error, 1)
	go func() { r.served <- r.srv.Serve(lis) }()
}

func (r *restartingKubelet) stop() {
	r.t.Helper()
	if r.srv == nil {
		return
	}
	r.srv.Stop()
	require.NoError(r.t, <-r.served)
	r.srv = nil
}

func (r *restartingKubelet) restart() {
	r.t.Helper()
	r.stop()
	r.start()
}

// next returns the next value of ch, failing the test after testTimeout.
func next[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testTimeout):
		require.FailNow(t, "timed out", "waiting for %s", what)
		panic("unreachable")
	}
}

// By default, a registered plugin follows its kubelet: each time
// kubelet.sock is created anew, it serves its socket again (the kubelet
// removed it) and registers again, so that the kubelet can dial it back.
func TestReregistersWhenKubeletSocketIsRecreated(t *testing.T) {
	dir := tempDir(t)
	k := newRestartingKubelet(t, dir)
	p, _ := startPlugin(t, Options{SocketDir: dir, Devices: devices("a")})
	require.NoError(t, p.Register(k.path))
	requireProtoEqual(t, p.RegisterRequest(), next(t, k.k.requests, "the registration"))
	next(t, k.k.options, "the dial-back")

	first, err := os.Lstat(p.SocketPath())
	require.NoError(t, err)
	for range 3 {
		k.restart()
		requireProtoEqual(t, p.RegisterRequest(), next(t, k.k.requests, "a registration after the restart"))
		next(t, k.k.options, "the dial-back after the restart")
	}
	// A new connection reaches the socket served again.
	again, err := os.Lstat(p.SocketPath())
	require.NoError(t, err)
	assert.False(t, os.SameFile(first, again), "the kubelet removed the first socket; the plugin made another")
	stream, err := pluginapi.NewDevicePluginClient(dial(t, p.SocketPath())).ListAndWatch(testContext(t), &pluginapi.Empty{})
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, recvIDs(t, stream))
	assert.Len(t, p.CallsOf(MethodGetDevicePluginOptions), 4, "one dial-back per registration")

	p.Stop()
	_, err = os.Lstat(p.SocketPath())
	require.ErrorIs(t, err, fs.ErrNotExist, "Stop removes the socket served again")
}

// With NoReregister, a plugin registers only when told to.
func TestNoReregisterRegistersOnlyWhenTold(t *testing.T) {
	dir := tempDir(t)
	k := newRestartingKubelet(t, dir)
	quiet, _ := startPlugin(t, Options{SocketDir: dir, Devices: devices("a"), NoReregister: true})
	require.NoError(t, quiet.Register(k.path))
	next(t, k.k.requests, "the registration of the quiet plugin")
	// A plugin that re-registers tells when the restart has been seen.
	nic, _ := startPlugin(t, Options{ResourceName: "example.com/nic", SocketDir: dir, Devices: devices("n")})
	require.NoError(t, nic.Register(k.path))
	next(t, k.k.requests, "the registration of the nic plugin")

	k.restart()
	assert.Equal(t, "example.com/nic", next(t, k.k.requests, "a registration after the restart").GetResourceName())
	assert.Empty(t, k.k.requests, "the quiet plugin did not register again")
	_, err := os.Lstat(quiet.SocketPath())
	require.ErrorIs(t, err, fs.ErrNotExist, "the quiet plugin did not serve its socket again")
}

// A new Plugin started on the socket path of one still running (a simulated
// plugin restart) follows the kubelet in its place: the old one neither
// takes the socket back nor registers again.
func TestNewerPluginOnTheSamePathReregistersAlone(t *testing.T) {
	dir := tempDir(t)
	k := newRestartingKubelet(t, dir)
	old, _ := startPlugin(t, Options{SocketDir: dir, Devices: devices("a")})
	require.NoError(t, old.Register(k.path))
	next(t, k.k.requests, "the old plugin's registration")
	newer, _ := startPlugin(t, Options{SocketDir: dir, Devices: devices("a")})
	require.NoError(t, newer.Register(k.path))
	next(t, k.k.requests, "the newer plugin's registration")

	k.restart()
	next(t, k.k.requests, "a registration after the restart")
	_, err := newer.WaitForCalls(testContext(t), MethodGetDevicePluginOptions, 2)
	require.NoError(t, err, "the kubelet dialled the newer plugin back")
	assert.Len(t, old.CallsOf(MethodGetDevicePluginOptions), 1, "only at its own registration")
	assert.Empty(t, k.k.requests)

	old.Stop()
	_, err = os.Lstat(newer.SocketPath())
	require.NoError(t, err, "the old plugin leaves the newer one's socket")
}

// Allocate's refusal of unlisted devices is a hook away: an AllocateFunc
// answering DefaultAllocate grants any ID, and one that edits the answer
// keeps the refusal with CheckListed.
func TestAllocateFuncWithoutRefusal(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a")})
	ctx := testContext(t)
	p.SetAllocateFunc(func(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		return p.DefaultAllocate(req), nil
	})
	got, err := client.Allocate(ctx, allocReq("z"))
	require.NoError(t, err)
	requireProtoEqual(t, p.DefaultAllocate(allocReq("z")), got)

	require.NoError(t, p.CheckListed(allocReq("a")))
	err = p.CheckListed(&pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"a", "z"}}, {DevicesIds: []string{"z", "y"}},
	}})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Equal(t, `plugintest: example.com/gpu never listed devices ["z" "y"]`, status.Convert(err).Message())
}
