package plugintest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	regapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// fakeKubelet is a minimal kubelet Registration service: it records each
// request, dials the plugin back and fetches its options, as the kubelet
// does inside Register, unless err is set.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir      string
	err      error
	requests chan *pluginapi.RegisterRequest
	options  chan *pluginapi.DevicePluginOptions
}

func (k *fakeKubelet) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.requests <- proto.CloneOf(req)
	if k.err != nil {
		return nil, k.err
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, req.GetEndpoint()),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	opts, err := pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		return nil, err
	}
	k.options <- opts
	return &pluginapi.Empty{}, nil
}

// startKubelet serves a fakeKubelet on dir/kubelet.sock until the test ends.
func startKubelet(t *testing.T, dir string, err error) (*fakeKubelet, string) {
	t.Helper()
	k := &fakeKubelet{
		dir:      dir,
		err:      err,
		requests: make(chan *pluginapi.RegisterRequest, 10),
		options:  make(chan *pluginapi.DevicePluginOptions, 10),
	}
	path := filepath.Join(dir, "kubelet.sock")
	lis, lerr := net.Listen("unix", path)
	require.NoError(t, lerr)
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		require.NoError(t, <-served)
	})
	return k, path
}

func TestRegister(t *testing.T) {
	dir := tempDir(t)
	kubelet, kubeletSock := startKubelet(t, dir, nil)
	p, _ := startPlugin(t, Options{SocketDir: dir, PreStartRequired: true})

	require.NoError(t, p.Register(kubeletSock))
	want := &pluginapi.RegisterRequest{
		Version:      "v1beta1",
		Endpoint:     "example.com-gpu.sock",
		ResourceName: testResource,
		Options:      &pluginapi.DevicePluginOptions{PreStartRequired: true},
	}
	requireProtoEqual(t, want, <-kubelet.requests)
	requireProtoEqual(t, &pluginapi.DevicePluginOptions{PreStartRequired: true}, <-kubelet.options)
	requireProtoEqual(t, want, p.RegisterRequest())

	// Re-registration sends the same request again.
	require.NoError(t, p.Register(kubeletSock))
	requireProtoEqual(t, want, <-kubelet.requests)
	assert.Len(t, p.CallsOf(MethodGetDevicePluginOptions), 2, "the fake kubelet dialled back twice")
}

func TestRegisterOptionsOverride(t *testing.T) {
	dir := tempDir(t)
	kubelet, kubeletSock := startKubelet(t, dir, nil)
	p, _ := startPlugin(t, Options{
		SocketDir:           dir,
		Endpoint:            "gpu",
		RegistrationOptions: &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	require.NoError(t, p.Register(kubeletSock))
	got := <-kubelet.requests
	assert.Equal(t, "gpu", got.GetEndpoint())
	requireProtoEqual(t, &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, got.GetOptions())
	requireProtoEqual(t, &pluginapi.DevicePluginOptions{}, <-kubelet.options)
}

func TestRegisterWithMalformedRequest(t *testing.T) {
	dir := tempDir(t)
	kubelet, kubeletSock := startKubelet(t, dir, status.Error(codes.InvalidArgument, "bad request"))
	p, _ := startPlugin(t, Options{SocketDir: dir})

	req := p.RegisterRequest()
	req.Version = "v1alpha1"
	req.Endpoint = "../escape.sock"
	req.ResourceName = "no-slash"
	err := p.RegisterWith(testContext(t), kubeletSock, req)
	require.ErrorContains(t, err, `register "no-slash"`)
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "the status survives wrapping")
	requireProtoEqual(t, req, <-kubelet.requests)
	assert.Equal(t, "v1beta1", p.RegisterRequest().GetVersion(), "RegisterRequest returns a new message")
}

func TestRegisterWithoutKubelet(t *testing.T) {
	p, _ := startPlugin(t, Options{})
	ctx, cancel := context.WithTimeout(testContext(t), 50*time.Millisecond)
	defer cancel()
	err := p.RegisterWith(ctx, filepath.Join(tempDir(t), "kubelet.sock"), p.RegisterRequest())
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
}

func TestRegistry(t *testing.T) {
	p, _ := startPlugin(t, Options{Devices: devices("a")})
	regDir := tempDir(t)
	require.NoError(t, p.ServeRegistry(regDir))
	sock := filepath.Join(regDir, "example.com-gpu-reg.sock")
	assert.Equal(t, sock, p.RegistrySocketPath())
	require.ErrorContains(t, p.ServeRegistry(regDir), "already serving")
	ctx := testContext(t)

	// What the kubelet's plugin watcher does: GetInfo, dial the endpoint,
	// report the outcome.
	watcher := regapi.NewRegistrationClient(dial(t, sock))
	info, err := watcher.GetInfo(ctx, &regapi.InfoRequest{})
	require.NoError(t, err)
	requireProtoEqual(t, &regapi.PluginInfo{
		Type:              "DevicePlugin",
		Name:              testResource,
		Endpoint:          p.SocketPath(),
		SupportedVersions: []string{"v1beta1"},
	}, info)
	plugin := pluginapi.NewDevicePluginClient(dial(t, info.GetEndpoint()))
	stream, err := plugin.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, recvIDs(t, stream))

	_, err = watcher.NotifyRegistrationStatus(ctx, &regapi.RegistrationStatus{PluginRegistered: true})
	require.NoError(t, err)
	got, err := p.WaitForRegistrationStatus(ctx)
	require.NoError(t, err)
	requireProtoEqual(t, &regapi.RegistrationStatus{PluginRegistered: true}, got)

	_, err = watcher.NotifyRegistrationStatus(ctx, &regapi.RegistrationStatus{Error: "refused"})
	require.NoError(t, err)
	calls, err := p.WaitForCalls(ctx, MethodNotifyRegistrationStatus, 2)
	require.NoError(t, err)
	require.Len(t, calls, 2)
	got, err = p.WaitForRegistrationStatus(ctx)
	require.NoError(t, err)
	requireProtoEqual(t, &regapi.RegistrationStatus{Error: "refused"}, got)
	assert.Len(t, p.CallsOf(MethodGetInfo), 1)
}

func TestRegistryPluginInfoOverrideAndErrors(t *testing.T) {
	p, _ := startPlugin(t, Options{})
	regDir := tempDir(t)
	require.NoError(t, p.ServeRegistry(regDir))
	watcher := regapi.NewRegistrationClient(dial(t, p.RegistrySocketPath()))
	ctx := testContext(t)

	bad := &regapi.PluginInfo{Type: "DevicePlugin", Name: "bad name", SupportedVersions: []string{"v1alpha"}}
	p.SetPluginInfo(bad)
	bad.Name = "changed after SetPluginInfo"
	info, err := watcher.GetInfo(ctx, &regapi.InfoRequest{})
	require.NoError(t, err)
	assert.Equal(t, "bad name", info.GetName())
	assert.Equal(t, []string{"v1alpha"}, info.GetSupportedVersions())
	assert.Equal(t, "bad name", p.PluginInfo().GetName())

	p.SetPluginInfo(nil)
	assert.Equal(t, testResource, p.PluginInfo().GetName())

	p.SetError(MethodGetInfo, status.Error(codes.Internal, "no info"))
	_, err = watcher.GetInfo(ctx, &regapi.InfoRequest{})
	assert.Equal(t, codes.Internal, status.Code(err))
	p.SetError(MethodNotifyRegistrationStatus, status.Error(codes.Internal, "no ack"))
	_, err = watcher.NotifyRegistrationStatus(ctx, &regapi.RegistrationStatus{PluginRegistered: true})
	assert.Equal(t, codes.Internal, status.Code(err))
	got, err := p.WaitForRegistrationStatus(ctx)
	require.NoError(t, err)
	assert.True(t, got.GetPluginRegistered(), "the status is recorded even when the call fails")
}

func TestStopRegistry(t *testing.T) {
	p, client := startPlugin(t, Options{})
	regDir := tempDir(t)
	require.NoError(t, p.ServeRegistry(regDir))
	sock := p.RegistrySocketPath()

	p.StopRegistry()
	assert.Empty(t, p.RegistrySocketPath())
	_, err := os.Lstat(sock)
	require.ErrorIs(t, err, os.ErrNotExist)
	p.StopRegistry() // no-op
	_, err = client.GetDevicePluginOptions(testContext(t), &pluginapi.Empty{})
	require.NoError(t, err, "the device plugin keeps serving")

	require.NoError(t, p.ServeRegistry(regDir), "the registry can serve again")
	p.Stop()
	_, err = os.Lstat(sock)
	require.ErrorIs(t, err, os.ErrNotExist, "Stop removes the registry socket")
}

func TestServeRegistryErrors(t *testing.T) {
	p, err := New(Options{ResourceName: testResource, SocketDir: tempDir(t)})
	require.NoError(t, err)
	regDir := tempDir(t)
	require.ErrorIs(t, p.ServeRegistry(regDir), ErrNotStarted)
	require.ErrorContains(t, p.ServeRegistry("relative"), "not absolute")

	p.Stop()
	require.ErrorIs(t, p.ServeRegistry(regDir), ErrStopped)

	p, _ = startPlugin(t, Options{})
	long := filepath.Join(regDir, strings.Repeat("r", 100))
	require.ErrorContains(t, p.ServeRegistry(long), "longer than 107 bytes")
	require.NoError(t, os.WriteFile(filepath.Join(regDir, "example.com-gpu-reg.sock"), nil, 0o600))
	require.ErrorContains(t, p.ServeRegistry(regDir), "not a socket")
	assert.Empty(t, p.RegistrySocketPath())
}

// Stop ends a Register that waits for a kubelet.
func TestStopEndsRegister(t *testing.T) {
	p, _ := startPlugin(t, Options{})
	nobody := filepath.Join(tempDir(t), "kubelet.sock")
	done := make(chan error, 1)
	go func() { done <- p.Register(nobody) }()
	p.Stop()
	select {
	case err := <-done:
		assert.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	case <-time.After(RegisterTimeout / 2):
		require.FailNow(t, "Register still waits after Stop")
	}
}
