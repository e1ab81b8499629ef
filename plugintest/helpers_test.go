package plugintest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// testTimeout bounds every wait in these tests; it is reached only when a
// test fails.
const testTimeout = 20 * time.Second

const testResource = "example.com/gpu"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// tempDir returns a short temporary directory: a socket path must fit in
// 108 bytes, which t.TempDir often exceeds.
func tempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pt")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, os.RemoveAll(dir)) })
	return dir
}

// testContext returns a context cancelled at the end of the test or after
// testTimeout.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// dial returns a client connection to the unix socket path, closed at the
// end of the test.
func dial(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, conn.Close()) })
	return conn
}

// startPlugin starts a plugin for testResource in a new directory, with opts
// completed by defaults, and returns it with a client of it. Both are
// stopped at the end of the test.
func startPlugin(t *testing.T, opts Options) (*Plugin, pluginapi.DevicePluginClient) {
	t.Helper()
	if opts.ResourceName == "" {
		opts.ResourceName = testResource
	}
	if opts.SocketDir == "" {
		opts.SocketDir = tempDir(t)
	}
	p, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(p.Stop) // registered before dial: runs after the client closes
	require.NoError(t, p.Start())
	return p, pluginapi.NewDevicePluginClient(dial(t, p.SocketPath()))
}

func devices(ids ...string) []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(ids))
	for _, id := range ids {
		out = append(out, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	return out
}

func deviceIDs(devs []*pluginapi.Device) []string {
	out := make([]string, 0, len(devs))
	for _, d := range devs {
		out = append(out, d.GetID())
	}
	return out
}

func requireProtoEqual(t *testing.T, want, got proto.Message) {
	t.Helper()
	if !proto.Equal(want, got) {
		require.Failf(t, "messages differ", "want:\n%s\ngot:\n%s", prototext.Format(want), prototext.Format(got))
	}
}

// recvIDs receives one ListAndWatch message and returns its device IDs.
func recvIDs(t *testing.T, stream grpc.ServerStreamingClient[pluginapi.ListAndWatchResponse]) []string {
	t.Helper()
	msg, err := stream.Recv()
	require.NoError(t, err)
	return deviceIDs(msg.GetDevices())
}
