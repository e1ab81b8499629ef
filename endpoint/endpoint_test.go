package endpoint

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/openkubelet/devmgr/plugintest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const res = "example.com/dev"

func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ep")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func startPlugin(t *testing.T, devs []*pluginapi.Device, tune ...func(*plugintest.Options)) *plugintest.Plugin {
	t.Helper()
	o := plugintest.Options{ResourceName: res, SocketDir: shortDir(t), Endpoint: "p.sock", Devices: devs}
	for _, f := range tune {
		f(&o)
	}
	p, err := plugintest.New(o)
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	require.NoError(t, p.Start())
	return p
}

func dial(t *testing.T, p *plugintest.Plugin, opts Options) *Endpoint {
	t.Helper()
	e, err := Dial(context.Background(), res, p.SocketPath(), opts)
	require.NoError(t, err)
	t.Cleanup(e.Stop)
	return e
}

// runResult is the outcome of Run: err is set before done is closed.
type runResult struct {
	done chan struct{}
	err  error
}

// wait returns Run's error, failing the test if Run does not end in time.
func (r *runResult) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not end")
		return nil
	}
}

// run starts Run in a goroutine and returns the received messages and Run's
// result; the endpoint is stopped and Run awaited at cleanup.
func run(t *testing.T, e *Endpoint) (<-chan *pluginapi.ListAndWatchResponse, *runResult) {
	t.Helper()
	msgs := make(chan *pluginapi.ListAndWatchResponse, 16)
	r := &runResult{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = e.Run(context.Background(), func(m *pluginapi.ListAndWatchResponse) { msgs <- m })
	}()
	t.Cleanup(func() {
		e.Stop()
		<-r.done
	})
	return msgs, r
}

// recv returns what the callback sent for the next ListAndWatch message.
func recv[T any](t *testing.T, msgs <-chan T) T {
	t.Helper()
	select {
	case m := <-msgs:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no ListAndWatch message")
		var zero T
		return zero
	}
}

// Mirrors upstream TestNewEndpoint: dial a plugin, read its options, stop.
func TestDialFetchesOptions(t *testing.T) {
	p := startPlugin(t, nil, func(o *plugintest.Options) { o.PreStartRequired = true })
	e := dial(t, p, Options{})
	assert.Equal(t, p.SocketPath(), e.SocketPath())
	assert.True(t, e.Options().GetPreStartRequired())
	assert.False(t, e.Options().GetGetPreferredAllocationAvailable())
	assert.False(t, e.IsStopped())
	e.Stop()
	e.Stop()
	assert.True(t, e.IsStopped())
	_, err := e.Allocate(context.Background(), nil)
	assert.EqualError(t, err, "endpoint "+res+" ("+p.SocketPath()+") has been stopped: endpoint has been stopped")
}

// With a Dialer, path only names the instance: no file of that name is
// looked for, and the connection is the Dialer's.
func TestDialThroughDialer(t *testing.T) {
	p := startPlugin(t, []*pluginapi.Device{{ID: "d", Health: pluginapi.Healthy}},
		func(o *plugintest.Options) { o.PreStartRequired = true })
	dialed := 0
	e, err := Dial(context.Background(), res, "local:"+res, Options{Dialer: func(ctx context.Context) (net.Conn, error) {
		dialed++
		var d net.Dialer
		return d.DialContext(ctx, "unix", p.SocketPath())
	}})
	require.NoError(t, err)
	t.Cleanup(e.Stop)
	assert.Equal(t, 1, dialed)
	assert.Equal(t, "local:"+res, e.SocketPath())
	assert.True(t, e.Options().GetPreStartRequired())
	msgs, _ := run(t, e)
	assert.Equal(t, "d", recv(t, msgs).Devices[0].ID)
}

// Mirrors upstream TestRun: the first message is the initial list, the next
// one the update, in order and complete.
func TestRunDeliversEveryMessage(t *testing.T) {
	p := startPlugin(t, []*pluginapi.Device{
		{ID: "A", Health: pluginapi.Healthy}, {ID: "B", Health: pluginapi.Healthy}, {ID: "C", Health: pluginapi.Unhealthy},
	})
	e := dial(t, p, Options{})
	msgs, _ := run(t, e)
	first := recv(t, msgs)
	require.Len(t, first.Devices, 3)
	for i, want := range []struct{ id, health string }{{"A", "Healthy"}, {"B", "Healthy"}, {"C", "Unhealthy"}} {
		assert.Equal(t, want.id, first.Devices[i].ID)
		assert.Equal(t, want.health, first.Devices[i].Health)
	}
	update := []*pluginapi.Device{
		{ID: "A", Health: pluginapi.Unhealthy}, {ID: "C", Health: pluginapi.Healthy}, {ID: "D", Health: pluginapi.Healthy},
	}
	p.Update(update)
	second := recv(t, msgs)
	require.Len(t, second.Devices, 3)
	for i, d := range update {
		assert.True(t, proto.Equal(d, second.Devices[i]))
	}
}

func TestRunEndsWithTheStream(t *testing.T) {
	p := startPlugin(t, nil)
	e := dial(t, p, Options{})
	msgs, done := run(t, e)
	recv(t, msgs)
	p.CloseStreams()
	assert.ErrorContains(t, done.wait(t), "ListAndWatch")
}

func TestStopEndsRunWithoutError(t *testing.T) {
	p := startPlugin(t, nil)
	e := dial(t, p, Options{})
	msgs, done := run(t, e)
	recv(t, msgs)
	e.Stop()
	assert.NoError(t, done.wait(t))
	assert.ErrorIs(t, e.Run(context.Background(), nil), ErrStopped)
}

// Mirrors upstream TestAllocate, plus PreStart and the request shapes.
func TestRPCs(t *testing.T) {
	p := startPlugin(t, nil)
	want := &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{{
		Devices: []*pluginapi.DeviceSpec{{ContainerPath: "/dev/a", HostPath: "/dev/a", Permissions: "mrw"},
			{ContainerPath: "/dev/b", HostPath: "/dev/b", Permissions: "mrw"}},
		Mounts: []*pluginapi.Mount{{ContainerPath: "/m", HostPath: "/host/m", ReadOnly: true}},
	}}}
	p.SetAllocateFunc(func(context.Context, *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		return want, nil
	})
	prefer := &pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{
		{DeviceIDs: []string{"device0", "device1", "device2"}}}}
	p.SetPreferredAllocationFunc(func(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
		return prefer, nil
	})
	e := dial(t, p, Options{})

	got, err := e.Allocate(context.Background(), []string{"ADeviceId"})
	require.NoError(t, err)
	assert.True(t, proto.Equal(want, got))
	calls := p.CallsOf(plugintest.MethodAllocate)
	require.Len(t, calls, 1)
	assert.True(t, proto.Equal(&pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"ADeviceId"}}}}, calls[0].Request))
	assert.False(t, calls[0].Deadline.IsZero(), "every call has a deadline")

	gotPref, err := e.GetPreferredAllocation(context.Background(), []string{"a", "b"}, []string{"a"}, 1)
	require.NoError(t, err)
	assert.True(t, proto.Equal(prefer, gotPref))
	pcalls := p.CallsOf(plugintest.MethodGetPreferredAllocation)
	require.Len(t, pcalls, 1)
	assert.True(t, proto.Equal(&pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"a", "b"}, MustIncludeDeviceIDs: []string{"a"}, AllocationSize: 1}}}, pcalls[0].Request))

	_, err = e.PreStartContainer(context.Background(), []string{"a"})
	require.NoError(t, err)
	scalls := p.CallsOf(plugintest.MethodPreStartContainer)
	require.Len(t, scalls, 1)
	assert.True(t, proto.Equal(&pluginapi.PreStartContainerRequest{DevicesIds: []string{"a"}}, scalls[0].Request))
}

// A hung plugin costs the caller its deadline, not more.
func TestCallDeadlines(t *testing.T) {
	p := startPlugin(t, nil)
	// Long enough for each call to reach the plugin before its deadline.
	const callTimeout, preStartTimeout = time.Second, 1200 * time.Millisecond
	e := dial(t, p, Options{CallTimeout: callTimeout, PreStartTimeout: preStartTimeout})
	for _, m := range []plugintest.Method{plugintest.MethodAllocate, plugintest.MethodGetPreferredAllocation, plugintest.MethodPreStartContainer} {
		release := p.Block(m)
		defer release()
	}
	tests := []struct {
		name string
		call func() error
	}{
		{"Allocate", func() error { _, err := e.Allocate(context.Background(), []string{"a"}); return err }},
		{"GetPreferredAllocation", func() error {
			_, err := e.GetPreferredAllocation(context.Background(), nil, nil, 1)
			return err
		}},
		{"PreStartContainer", func() error { _, err := e.PreStartContainer(context.Background(), nil); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
		})
	}
	// The recorded deadlines are the configured ones.
	for _, tc := range []struct {
		m    plugintest.Method
		want time.Duration
	}{{plugintest.MethodAllocate, callTimeout}, {plugintest.MethodGetPreferredAllocation, callTimeout}, {plugintest.MethodPreStartContainer, preStartTimeout}} {
		calls := p.CallsOf(tc.m)
		require.Len(t, calls, 1)
		budget := calls[0].Deadline.Sub(calls[0].Time)
		assert.LessOrEqual(t, budget, tc.want, tc.m)
	}
}

func TestStoppedEndpointRefusesCalls(t *testing.T) {
	p := startPlugin(t, nil)
	e := dial(t, p, Options{})
	e.Stop()
	_, err := e.Allocate(context.Background(), nil)
	require.ErrorIs(t, err, ErrStopped)
	assert.ErrorContains(t, err, "endpoint "+res)
	_, err = e.PreStartContainer(context.Background(), nil)
	require.ErrorIs(t, err, ErrStopped)
	_, err = e.GetPreferredAllocation(context.Background(), nil, nil, 1)
	require.ErrorIs(t, err, ErrStopped)
	assert.Empty(t, p.CallsOf(plugintest.MethodAllocate))
}

func TestStopTimeOnTheClock(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	p := startPlugin(t, nil)
	e := dial(t, p, Options{Clock: clk})
	assert.True(t, e.StopTime().IsZero())
	e.Stop()
	assert.Equal(t, time.Unix(1000, 0), e.StopTime())
	clk.Step(time.Hour)
	e.Stop()
	assert.Equal(t, time.Unix(1000, 0), e.StopTime(), "a second Stop keeps the first stop time")

	s := NewStopped(res, clk)
	assert.True(t, s.IsStopped())
	assert.Nil(t, s.Options())
	assert.Empty(t, s.SocketPath())
	assert.Equal(t, clk.Now(), s.StopTime())
	_, err := s.Allocate(context.Background(), []string{"x"})
	require.ErrorIs(t, err, ErrStopped)
	require.ErrorIs(t, s.Run(context.Background(), nil), ErrStopped)
	s.Stop()
}

func TestDialFailures(t *testing.T) {
	dir := shortDir(t)
	regular := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(regular, nil, 0o600))

	// A socket that answers gRPC but serves no device plugin.
	other := filepath.Join(dir, "other.sock")
	lis, err := net.Listen("unix", other)
	require.NoError(t, err)
	srv := grpc.NewServer()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); wg.Wait() }()

	// A socket nobody listens on any more.
	stale := filepath.Join(dir, "stale.sock")
	l2, err := net.Listen("unix", stale)
	require.NoError(t, err)
	l2.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, l2.Close())

	// A socket that accepts connections and never says a word.
	silent := filepath.Join(dir, "silent.sock")
	l3, err := net.Listen("unix", silent)
	require.NoError(t, err)
	wg.Add(1)
	go func() {
		defer wg.Done()
		var held []net.Conn
		for {
			c, err := l3.Accept()
			if err != nil {
				for _, c := range held {
					_ = c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	defer func() { _ = l3.Close() }()

	// A path that is not a socket fails before gRPC is involved, so its
	// error carries no gRPC status; a socket where no plugin answers fails
	// when the dial's deadline passes. Only those cases wait the deadline
	// out; the others have a long one, so that a server that answers is
	// reached in time.
	const long, short = 5 * time.Second, 300 * time.Millisecond
	tests := []struct {
		name, path, want string
		code             codes.Code
		timeout          time.Duration
	}{
		{"missing", filepath.Join(dir, "missing.sock"), "does not exist", codes.Unknown, long},
		{"regular file", regular, "is not a unix socket", codes.Unknown, long},
		{"directory", dir, "is not a unix socket", codes.Unknown, long},
		{"not a device plugin", other, "failed to get device plugin options: " + other + ": rpc error: code = Unimplemented", codes.Unimplemented, long},
		{"nobody listening", stale, "failed to dial device plugin", codes.DeadlineExceeded, short},
		{"no gRPC server", silent, "failed to dial device plugin", codes.DeadlineExceeded, short},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Dial(context.Background(), res, tc.path, Options{DialTimeout: tc.timeout})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, tc.code, status.Code(unwrapStatus(err)), "%v", err)
		})
	}
}

// Dial gives up when DialTimeout passes, and at once when the caller's
// context is done, whichever comes first.
func TestDialDeadlines(t *testing.T) {
	p := startPlugin(t, nil)
	release := p.Block(plugintest.MethodGetDevicePluginOptions)
	defer release()

	// Long enough for the options call to reach the blocked plugin.
	const timeout = 1500 * time.Millisecond
	_, err := Dial(context.Background(), res, p.SocketPath(), Options{DialTimeout: timeout})
	require.ErrorContains(t, err, "failed to get device plugin options")
	assert.Equal(t, codes.DeadlineExceeded, status.Code(unwrapStatus(err)), "%v", err)
	calls := p.CallsOf(plugintest.MethodGetDevicePluginOptions)
	require.Len(t, calls, 1)
	require.False(t, calls[0].Deadline.IsZero(), "the options call has a deadline")
	assert.LessOrEqual(t, calls[0].Deadline.Sub(calls[0].Time), timeout, "the deadline is DialTimeout")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Dial(ctx, res, p.SocketPath(), Options{DialTimeout: time.Hour})
	require.ErrorContains(t, err, "failed to dial device plugin")
	assert.Equal(t, codes.Canceled, status.Code(unwrapStatus(err)), "%v", err)
}

// A failed call reached a server when the connection is up, or when the
// error is one only a server sends; Unavailable, DeadlineExceeded and
// Canceled without a connection are failures to dial.
func TestReachedServer(t *testing.T) {
	for _, tc := range []struct {
		state connectivity.State
		err   error
		want  bool
	}{
		{connectivity.Ready, status.Error(codes.Unavailable, "x"), true},
		{connectivity.Ready, status.Error(codes.Unknown, "x"), true},
		{connectivity.Connecting, status.Error(codes.Unknown, "options broken"), true},
		{connectivity.Idle, status.Error(codes.Unimplemented, "x"), true},
		{connectivity.TransientFailure, status.Error(codes.Internal, "x"), true},
		{connectivity.TransientFailure, status.Error(codes.Unavailable, "connection refused"), false},
		{connectivity.Connecting, status.Error(codes.DeadlineExceeded, "x"), false},
		{connectivity.Idle, status.Error(codes.Canceled, "x"), false},
		{connectivity.Shutdown, context.DeadlineExceeded, false},
	} {
		assert.Equal(t, tc.want, reachedServer(tc.state, tc.err), "%v, %v", tc.state, tc.err)
	}
}

// A ListAndWatch message above MaxRecvMsgSize ends the stream with a clear
// error; the default is large enough for tens of thousands of devices.
func TestReceiveLimit(t *testing.T) {
	devs := make([]*pluginapi.Device, 20000)
	for i := range devs {
		devs[i] = &pluginapi.Device{ID: strings.Repeat("x", 40) + string(rune('a'+i%26)), Health: pluginapi.Healthy}
	}
	p := startPlugin(t, devs)

	small := dial(t, p, Options{MaxRecvMsgSize: 64 << 10})
	_, done := run(t, small)
	err := done.wait(t)
	assert.Equal(t, codes.ResourceExhausted, status.Code(unwrapStatus(err)), "%v", err)

	big := dial(t, p, Options{})
	msgs, _ := run(t, big)
	assert.Len(t, recv(t, msgs).Devices, len(devs))
}

func unwrapStatus(err error) error {
	for err != nil {
		if _, ok := status.FromError(err); ok {
			return err
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
	return err
}
