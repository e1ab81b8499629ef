package plugintest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestNewValidatesOptions(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{name: "no resource", opts: Options{SocketDir: "/tmp"}, wantErr: "ResourceName is required"},
		{name: "relative dir", opts: Options{ResourceName: testResource, SocketDir: "rel"}, wantErr: "not absolute"},
		{name: "endpoint with slash", opts: Options{ResourceName: testResource, SocketDir: "/tmp", Endpoint: "a/b.sock"}, wantErr: "not a bare file name"},
		{name: "endpoint dot-dot", opts: Options{ResourceName: testResource, SocketDir: "/tmp", Endpoint: ".."}, wantErr: "not a bare file name"},
		{name: "path too long", opts: Options{ResourceName: testResource, SocketDir: "/" + strings.Repeat("d", 100)}, wantErr: "longer than 107 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(tt.opts)
			require.ErrorContains(t, err, tt.wantErr)
			assert.Nil(t, p)
		})
	}
}

func TestNewDefaults(t *testing.T) {
	p, err := New(Options{ResourceName: testResource})
	require.NoError(t, err)
	assert.Equal(t, testResource, p.ResourceName())
	assert.Equal(t, "example.com-gpu.sock", p.Endpoint())
	assert.Equal(t, pluginapi.DevicePluginPath+"example.com-gpu.sock", p.SocketPath())

	p, err = New(Options{ResourceName: testResource, SocketDir: "/run/x", Endpoint: "gpu"})
	require.NoError(t, err)
	assert.Equal(t, "gpu", p.Endpoint(), "an endpoint without .sock is kept as given")
	assert.Equal(t, "/run/x/gpu", p.SocketPath())
}

func TestNewCopiesDevices(t *testing.T) {
	devs := devices("a")
	p, err := New(Options{ResourceName: testResource, Devices: devs})
	require.NoError(t, err)
	devs[0].ID = "changed"
	got := p.Devices()
	assert.Equal(t, []string{"a"}, deviceIDs(got))
	got[0].ID = "changed too"
	assert.Equal(t, []string{"a"}, deviceIDs(p.Devices()))
}

func TestStartServesAndStopRemovesSocket(t *testing.T) {
	p, client := startPlugin(t, Options{PreStartRequired: true, GetPreferredAllocationAvailable: true})
	ctx := testContext(t)

	got, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	requireProtoEqual(t, &pluginapi.DevicePluginOptions{PreStartRequired: true, GetPreferredAllocationAvailable: true}, got)

	p.Stop()
	_, err = os.Lstat(p.SocketPath())
	require.ErrorIs(t, err, os.ErrNotExist)
	p.Stop() // idempotent
	require.ErrorIs(t, p.Start(), ErrStopped)
}

func TestStartRemovesStaleSocket(t *testing.T) {
	dir := tempDir(t)
	// A socket left by a previous run: listening and closed without unlink.
	lis, err := net.Listen("unix", filepath.Join(dir, "example.com-gpu.sock"))
	require.NoError(t, err)
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, lis.Close())

	_, client := startPlugin(t, Options{SocketDir: dir})
	_, err = client.GetDevicePluginOptions(testContext(t), &pluginapi.Empty{})
	require.NoError(t, err)
}

func TestRestartOnSamePath(t *testing.T) {
	old, _ := startPlugin(t, Options{Devices: devices("old")})
	restarted, client := startPlugin(t, Options{SocketDir: filepath.Dir(old.SocketPath()), Devices: devices("new")})
	require.Equal(t, old.SocketPath(), restarted.SocketPath())

	old.Stop()
	_, err := os.Lstat(restarted.SocketPath())
	require.NoError(t, err, "the old plugin must not remove the new one's socket")
	stream, err := client.ListAndWatch(testContext(t), &pluginapi.Empty{})
	require.NoError(t, err)
	assert.Equal(t, []string{"new"}, recvIDs(t, stream))
	assert.Empty(t, old.CallsOf(MethodListAndWatch))
}

func TestStartRefusesNonSocket(t *testing.T) {
	dir := tempDir(t)
	path := filepath.Join(dir, "example.com-gpu.sock")
	require.NoError(t, os.WriteFile(path, []byte("data"), 0o600))
	p, err := New(Options{ResourceName: testResource, SocketDir: dir})
	require.NoError(t, err)
	t.Cleanup(p.Stop)

	require.ErrorContains(t, p.Start(), "not a socket")
	_, err = os.Stat(path)
	require.NoError(t, err, "a regular file must not be removed")
}

func TestStartFailsWithoutDir(t *testing.T) {
	p, err := New(Options{ResourceName: testResource, SocketDir: filepath.Join(tempDir(t), "missing")})
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	require.ErrorContains(t, p.Start(), "listen")
}

func TestStartTwice(t *testing.T) {
	p, _ := startPlugin(t, Options{})
	require.ErrorContains(t, p.Start(), "already started")
}

func TestStopBeforeStart(t *testing.T) {
	dir := tempDir(t)
	p, err := New(Options{ResourceName: testResource, SocketDir: dir})
	require.NoError(t, err)
	p.Stop()
	p.Stop()
	require.ErrorIs(t, p.Start(), ErrStopped)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)
}

func TestConcurrentStop(t *testing.T) {
	p, _ := startPlugin(t, Options{})
	done := make(chan struct{})
	for range 4 {
		go func() {
			p.Stop()
			done <- struct{}{}
		}()
	}
	for range 4 {
		<-done
	}
	require.ErrorIs(t, p.Start(), ErrStopped)
}

func TestOptionsFunc(t *testing.T) {
	p, client := startPlugin(t, Options{})
	ctx := testContext(t)
	p.SetOptionsFunc(func(ctx context.Context) (*pluginapi.DevicePluginOptions, error) {
		return &pluginapi.DevicePluginOptions{PreStartRequired: true}, nil
	})
	got, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	requireProtoEqual(t, &pluginapi.DevicePluginOptions{PreStartRequired: true}, got)

	p.SetOptionsFunc(func(ctx context.Context) (*pluginapi.DevicePluginOptions, error) { return nil, nil })
	got, err = client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	requireProtoEqual(t, &pluginapi.DevicePluginOptions{}, got)

	p.SetOptionsFunc(nil)
	got, err = client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	requireProtoEqual(t, &pluginapi.DevicePluginOptions{}, got)
}

func TestListAndWatchSendsListThenUpdates(t *testing.T) {
	initial := devices("b", "a")
	initial[1].Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}
	p, client := startPlugin(t, Options{Devices: initial})
	ctx := testContext(t)

	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	first, err := stream.Recv()
	require.NoError(t, err)
	requireProtoEqual(t, &pluginapi.ListAndWatchResponse{Devices: initial}, first)

	require.NoError(t, p.WaitForStreams(ctx, 1))
	assert.Equal(t, 1, p.Streams())
	second := devices("a", "c")
	second[0].Health = pluginapi.Unhealthy
	p.Update(second)
	p.Update(nil)
	msg, err := stream.Recv()
	require.NoError(t, err)
	requireProtoEqual(t, &pluginapi.ListAndWatchResponse{Devices: second}, msg)
	assert.Empty(t, recvIDs(t, stream), "every Update is delivered, an empty one too")

	// A stream opened later starts with the latest list.
	p.Update(devices("d"))
	late, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	assert.Equal(t, []string{"d"}, recvIDs(t, late))
	assert.Equal(t, []string{"d"}, recvIDs(t, stream))
	assert.Len(t, p.CallsOf(MethodListAndWatch), 2)
}

func TestListAndWatchEmptyFirstMessage(t *testing.T) {
	_, client := startPlugin(t, Options{Devices: devices("a", "b"), EmptyFirstMessage: true})
	stream, err := client.ListAndWatch(testContext(t), &pluginapi.Empty{})
	require.NoError(t, err)
	assert.Empty(t, recvIDs(t, stream))
	assert.Equal(t, []string{"a", "b"}, recvIDs(t, stream))
}

func TestCloseStreams(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a")})
	ctx := testContext(t)
	s1, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	s2, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	require.NoError(t, p.WaitForStreams(ctx, 2))

	p.CloseStreams()
	assert.Equal(t, 0, p.Streams())
	for _, stream := range []grpc.ServerStreamingClient[pluginapi.ListAndWatchResponse]{s1, s2} {
		// The first message may or may not have been sent before the close.
		msg, err := stream.Recv()
		if err == nil {
			assert.Equal(t, []string{"a"}, deviceIDs(msg.GetDevices()))
			_, err = stream.Recv()
		}
		require.ErrorIs(t, err, io.EOF)
	}

	// The server keeps serving: a new stream works and receives updates.
	s3, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, recvIDs(t, s3))
	p.Update(devices("b"))
	assert.Equal(t, []string{"b"}, recvIDs(t, s3))
}

func TestListAndWatchEndsWithClient(t *testing.T) {
	p, client := startPlugin(t, Options{})
	ctx := testContext(t)
	streamCtx, cancel := context.WithCancel(ctx)
	stream, err := client.ListAndWatch(streamCtx, &pluginapi.Empty{})
	require.NoError(t, err)
	recvIDs(t, stream)
	require.NoError(t, p.WaitForStreams(ctx, 1))
	cancel()
	require.NoError(t, p.WaitForStreams(ctx, 0), "the stream ends when the client cancels")
}

func TestStopEndsStreams(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a")})
	ctx := testContext(t)
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, recvIDs(t, stream))

	p.Stop()
	_, err = stream.Recv()
	require.Error(t, err)
	if !errors.Is(err, io.EOF) {
		assert.Equal(t, codes.Unavailable, status.Code(err))
	}
	p.Update(devices("b")) // no stream left; must not block
	assert.Equal(t, []string{"b"}, deviceIDs(p.Devices()))
}

func marshalList(t *testing.T, devs []*pluginapi.Device) []byte {
	t.Helper()
	b, err := proto.Marshal(&pluginapi.ListAndWatchResponse{Devices: devs})
	require.NoError(t, err)
	return b
}

func withUnknown(m proto.Message) {
	m.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7))
}

// unusualLists are lists a real plugin would hardly send, one oddity each,
// which a test may send on purpose.
func unusualLists() map[string][]*pluginapi.Device {
	odd := &pluginapi.Device{ID: "u", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}, {ID: 2}}}}
	withUnknown(odd)
	oddTopo := &pluginapi.Device{ID: "t", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}}
	withUnknown(oddTopo.Topology)
	oddNode := &pluginapi.Device{ID: "n", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 3}}}}
	withUnknown(oddNode.Topology.Nodes[0])
	plain := func() *pluginapi.Device { return &pluginapi.Device{ID: "a", Health: pluginapi.Healthy} }
	return map[string][]*pluginapi.Device{
		"nil device":             {plain(), nil},
		"nil node":               {{ID: "d", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}, nil}}}},
		"empty node list":        {plain(), {ID: "c", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{}}}},
		"unknown fields, device": {plain(), odd},
		"unknown fields, topo":   {oddTopo},
		"unknown fields, node":   {oddNode},
		"ID not UTF-8":           {plain(), {ID: "gpu-\xff"}},
		"health not UTF-8":       {{ID: "b", Health: "\xc3("}},
	}
}

// An unusual list reaches the client as gRPC encodes it: unknown fields and
// nil entries (as empty devices) arrive, and a string that is not UTF-8 ends
// the stream with the marshalling error.
func TestListAndWatchSendsUnusualLists(t *testing.T) {
	for name, devs := range unusualLists() {
		t.Run(name, func(t *testing.T) {
			p, client := startPlugin(t, Options{Devices: devices("first")})
			ctx := testContext(t)
			stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
			require.NoError(t, err)
			assert.Equal(t, []string{"first"}, recvIDs(t, stream))

			p.Update(devs)
			msg, err := stream.Recv()
			if strings.Contains(name, "UTF-8") {
				require.Error(t, err)
				assert.Equal(t, codes.Internal, status.Code(err), "%v", err)
				assert.Contains(t, err.Error(), "UTF-8")
				return
			}
			require.NoError(t, err)
			want := &pluginapi.ListAndWatchResponse{}
			require.NoError(t, proto.Unmarshal(marshalList(t, devs), want))
			requireProtoEqual(t, want, msg)
		})
	}
}

// Devices copies the list: it shares nothing with Update's argument or with
// an earlier copy, and keeps nil and empty lists apart, as Update was given
// them.
func TestDevicesCopies(t *testing.T) {
	lists := unusualLists()
	lists["plain"] = []*pluginapi.Device{
		{ID: "a", Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}},
		{ID: "b"},
		{ID: "c", Topology: &pluginapi.TopologyInfo{}},
	}
	lists["empty"] = []*pluginapi.Device{}
	lists["nil"] = nil
	for name, devs := range lists {
		p, err := New(Options{ResourceName: testResource})
		require.NoError(t, err)
		p.Update(devs)
		got := p.Devices()
		require.Len(t, got, len(devs), name)
		assert.Equal(t, devs == nil, got == nil, "%s: nil and empty lists", name)
		again := p.Devices()
		for i, d := range devs {
			if d == nil {
				assert.Nil(t, got[i], name)
				continue
			}
			assert.True(t, proto.Equal(d, got[i]), "%s: device %d: %v, want %v", name, i, got[i], d)
			assert.NotSame(t, d, got[i], name)
			assert.NotSame(t, got[i], again[i], name)
			if d.Topology != nil {
				assert.NotSame(t, d.Topology, got[i].Topology, name)
				assert.Equal(t, d.Topology.Nodes == nil, got[i].Topology.Nodes == nil, "%s: device %d: nil and empty nodes", name, i)
			}
		}
	}
}

// fill sets every field of m, and of the messages in it, to a value other
// than its zero value: a field the API adds is set too.
func fill(m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		switch {
		case f.IsList() && f.Message() != nil:
			fill(m.Mutable(f).List().AppendMutable().Message())
		case f.IsList():
			m.Mutable(f).List().Append(nonZero(f))
		case f.Message() != nil:
			fill(m.Mutable(f).Message())
		default:
			m.Set(f, nonZero(f))
		}
	}
}

// nonZero returns a value of the scalar kind of f other than its zero value.
func nonZero(f protoreflect.FieldDescriptor) protoreflect.Value {
	switch f.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(string(f.Name()) + "-value")
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(7)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(7)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(7)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(7)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(1)
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("b"))
	default:
		panic(fmt.Sprintf("fill: field %s of kind %v", f.FullName(), f.Kind()))
	}
}

// What Update and New are given reaches the streams and Devices whole, every
// field the API defines included, and later changes to it by the caller do
// not: the plugin sends and returns what it was given when it was given it.
func TestUpdateSendsACopy(t *testing.T) {
	full := &pluginapi.Device{}
	fill(full.ProtoReflect())
	require.NotEmpty(t, full.GetTopology().GetNodes(), "fill sets nested messages")
	want := []*pluginapi.Device{proto.CloneOf(full), {ID: "b", Health: pluginapi.Healthy}}

	initial := []*pluginapi.Device{proto.CloneOf(full), {ID: "b", Health: pluginapi.Healthy}}
	p, client := startPlugin(t, Options{Devices: initial})
	mutate := func(devs []*pluginapi.Device) {
		devs[0].ID = "changed"
		devs[0].Topology.Nodes[0].ID = 99
		devs[1] = &pluginapi.Device{ID: "replaced"}
	}
	mutate(initial)
	ctx := testContext(t)
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	first, err := stream.Recv()
	require.NoError(t, err)
	requireProtoEqual(t, &pluginapi.ListAndWatchResponse{Devices: want}, first)

	update := []*pluginapi.Device{proto.CloneOf(full), {ID: "b", Health: pluginapi.Healthy}}
	p.Update(update)
	mutate(update)
	second, err := stream.Recv()
	require.NoError(t, err)
	requireProtoEqual(t, &pluginapi.ListAndWatchResponse{Devices: want}, second)
	requireProtoEqual(t, &pluginapi.ListAndWatchResponse{Devices: want}, &pluginapi.ListAndWatchResponse{Devices: p.Devices()})
}
