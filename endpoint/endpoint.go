package endpoint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"sync"
	"time"

	"github.com/openkubelet/devmgr/internal/unixsock"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/clock"
)

// Defaults of Options.
const (
	DefaultCallTimeout     = 30 * time.Second
	DefaultPreStartTimeout = pluginapi.KubeletPreStartContainerRPCTimeoutInSecs * time.Second
	DefaultDialTimeout     = 10 * time.Second
	DefaultMaxRecvMsgSize  = 64 << 20
	// DefaultKeepaliveTime is twice the five minutes a gRPC server's default
	// enforcement policy asks between pings (see Options.KeepaliveTime).
	DefaultKeepaliveTime = 10 * time.Minute
	// DefaultKeepaliveTimeout is as long as an Allocate call may take: a
	// plugin process that cannot answer a ping in that time is not serving.
	DefaultKeepaliveTimeout = 30 * time.Second
)

// ErrStopped is returned by every call on a stopped endpoint.
var ErrStopped = errors.New("endpoint has been stopped")

// Options tune an endpoint. Zero values mean the defaults.
type Options struct {
	// CallTimeout bounds each Allocate and GetPreferredAllocation call.
	CallTimeout time.Duration
	// PreStartTimeout bounds each PreStartContainer call (the kubelet's 30 s).
	PreStartTimeout time.Duration
	// DialTimeout bounds Dial: connecting and fetching the plugin's options.
	DialTimeout time.Duration
	// MaxRecvMsgSize is the largest message accepted from the plugin, in
	// bytes; it matters for ListAndWatch lists of tens of thousands of IDs.
	MaxRecvMsgSize int
	// KeepaliveTime is how long the connection may carry nothing from the
	// plugin before the endpoint pings it, and KeepaliveTimeout how long it
	// then waits for an answer (any frame) before it closes the connection,
	// which ends the ListAndWatch stream as a plugin that went away does.
	// This finds a plugin whose process is alive but whose connection is
	// wedged (stopped, hung, or behind a proxy that stopped forwarding).
	// Pings are sent only while a call is open, as gRPC servers demand.
	//
	// Plugins run ordinary gRPC servers, and a server's default policy
	// counts a ping as a strike when it comes less than five minutes after
	// the previous one and the server sent no data or headers in between;
	// at the third strike it closes the connection (GOAWAY
	// "too_many_pings"). The client pings only after KeepaliveTime with
	// nothing read, and a ping's answer counts as a read, so pings are at
	// least KeepaliveTime apart as the server sees them. The default, twice
	// the server's five minutes, keeps them apart even if the manager's
	// wall clock jumps forward by up to five minutes (gRPC schedules the
	// next ping from a wall-clock time). gRPC raises a value under ten
	// seconds to ten seconds.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// Clock gives stop times; default the real clock.
	Clock clock.PassiveClock
	// Dialer, when set, opens the connection to the plugin instead of the
	// unix socket: Dial's path then only names the instance (SocketPath,
	// errors) and is not looked up in the file system.
	Dialer func(context.Context) (net.Conn, error)
}

func (o Options) withDefaults() Options {
	orDefault(&o.CallTimeout, DefaultCallTimeout)
	orDefault(&o.PreStartTimeout, DefaultPreStartTimeout)
	orDefault(&o.DialTimeout, DefaultDialTimeout)
	orDefault(&o.MaxRecvMsgSize, DefaultMaxRecvMsgSize)
	orDefault(&o.KeepaliveTime, DefaultKeepaliveTime)
	orDefault(&o.KeepaliveTimeout, DefaultKeepaliveTimeout)
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return o
}

// orDefault sets *v to def unless it is positive.
func orDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Endpoint is one plugin instance of one resource.
type Endpoint struct {
	resource string
	socket   string
	opts     Options
	conn     *grpc.ClientConn // nil for a stopped placeholder
	client   pluginapi.DevicePluginClient
	options  *pluginapi.DevicePluginOptions // nil for a stopped placeholder

	// ctx is cancelled by Stop; it ends the ListAndWatch stream.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards the fields below.
	mu       sync.Mutex
	stopTime time.Time
	closed   bool
}

// Dial connects to the plugin serving resource on the unix socket at path (or
// through opts.Dialer) and fetches its DevicePluginOptions, all within
// opts.DialTimeout (and ctx). Without a Dialer the socket must exist and be a
// socket: anything else fails at once with a clear error instead of waiting
// for the deadline. On any error the connection is closed.
func Dial(ctx context.Context, resource, path string, opts Options) (*Endpoint, error) {
	opts = opts.withDefaults()
	if err := ctx.Err(); err != nil {
		// The caller gave up before any dial. Checked here because a call
		// made with a done context can still race the channel to Ready and
		// would then be reported as the plugin's failure.
		return nil, fmt.Errorf("failed to dial device plugin: %s: %w", path, status.FromContextError(err).Err())
	}
	dialOpts := []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxRecvMsgSize)),
		// No pings without an open call: a default server counts every
		// such ping within two hours of the last as a strike.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: opts.KeepaliveTime, Timeout: opts.KeepaliveTimeout, PermitWithoutStream: false,
		}),
	}
	if opts.Dialer != nil {
		dialOpts = append(dialOpts, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return opts.Dialer(ctx) }))
	} else if err := checkSocket(path); err != nil {
		return nil, err
	}
	conn, err := unixsock.NewClient(path, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("failed to dial device plugin: %s: %w", path, err)
	}
	client := pluginapi.NewDevicePluginClient(conn)
	dctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	options, err := client.GetDevicePluginOptions(dctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		connected := reachedServer(conn.GetState(), err)
		_ = conn.Close()
		if !connected {
			// No gRPC server answered on the socket within the deadline
			// (or it went away): the kubelet's blocking dial reports this
			// as a dial failure.
			return nil, fmt.Errorf("failed to dial device plugin: %s: %w", path, err)
		}
		return nil, fmt.Errorf("failed to get device plugin options: %s: %w", path, err)
	}
	if options == nil {
		options = &pluginapi.DevicePluginOptions{}
	}
	e := &Endpoint{resource: resource, socket: path, opts: opts, conn: conn, client: client, options: options}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	return e, nil
}

// checkSocket returns an error unless path exists and is a unix socket.
func checkSocket(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("failed to dial device plugin: socket %s does not exist", path)
		}
		return fmt.Errorf("failed to dial device plugin: %s: %w", path, err)
	}
	if info.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("failed to dial device plugin: %s is not a unix socket", path)
	}
	return nil
}

// reachedServer reports whether a call that failed with err reached a gRPC
// server: the connection is up (state), or the error is one a server sent.
// The state alone does not tell: under load, a plugin's own error can arrive
// with the connection no longer Ready, and would be reported as a failure to
// dial. Unavailable, DeadlineExceeded and Canceled are what a client reports
// without a server (none listening, none answering in time, the caller gave
// up), and an error that is not a status is not an answer.
func reachedServer(state connectivity.State, err error) bool {
	if state == connectivity.Ready {
		return true
	}
	st, ok := status.FromError(err)
	if !ok {
		return false // not an answer: gRPC turns every answer into a status
	}
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return false
	}
	return true
}

// NewStopped returns a placeholder endpoint for a resource whose plugin is not
// connected (restored from a checkpoint): stopped now, no options, every call
// refused with ErrStopped.
func NewStopped(resource string, c clock.PassiveClock) *Endpoint {
	opts := Options{Clock: c}.withDefaults()
	e := &Endpoint{resource: resource, opts: opts, stopTime: opts.Clock.Now(), closed: true}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.cancel()
	return e
}

// SocketPath returns the plugin's socket path ("" for a placeholder).
func (e *Endpoint) SocketPath() string { return e.socket }

// Options returns the plugin's options as fetched by Dial; nil for a
// placeholder. The value must not be modified.
func (e *Endpoint) Options() *pluginapi.DevicePluginOptions { return e.options }

// Run opens the ListAndWatch stream and calls onMessage for every message, in
// order, until the stream ends, ctx is cancelled or the endpoint is stopped.
// It returns the reason the stream ended (nil when stopped or cancelled
// meanwhile; ErrStopped when the endpoint was stopped before).
// onMessage runs on Run's goroutine; a slow callback delays the next message.
// Every message is decoded anew by gRPC's protobuf codec: the callback owns
// it, and its devices share nothing with those of earlier messages.
func (e *Endpoint) Run(ctx context.Context, onMessage func(*pluginapi.ListAndWatchResponse)) error {
	if e.client == nil || e.IsStopped() {
		return ErrStopped
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(e.ctx, cancel)
	defer stop()

	stream, err := e.client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return e.streamErr(ctx, fmt.Errorf("open ListAndWatch: %w", err))
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			return e.streamErr(ctx, fmt.Errorf("ListAndWatch: %w", err))
		}
		onMessage(msg)
	}
}

// streamErr returns err unless the stream ended because ctx was cancelled
// (Stop, or the caller), which is not a failure.
func (e *Endpoint) streamErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil //nolint:nilerr // cancellation is the expected end of the stream
	}
	return err
}

// Stop marks the endpoint stopped at the clock's current time (unless it was
// already), ends its stream and closes its connection. Idempotent.
func (e *Endpoint) Stop() {
	e.mu.Lock()
	if e.stopTime.IsZero() {
		e.stopTime = e.opts.Clock.Now()
	}
	closeConn := !e.closed
	e.closed = true
	e.mu.Unlock()
	e.cancel()
	if closeConn && e.conn != nil {
		_ = e.conn.Close()
	}
}

// IsStopped reports whether Stop was called (or the endpoint is a placeholder).
func (e *Endpoint) IsStopped() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.stopTime.IsZero()
}

// StopTime returns when the endpoint was stopped; zero while it runs.
func (e *Endpoint) StopTime() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stopTime
}

// call makes one RPC on the plugin within timeout, or returns the kubelet's
// error for a call on a stopped endpoint.
func call[Req, Resp any](ctx context.Context, e *Endpoint, timeout time.Duration,
	rpc func(pluginapi.DevicePluginClient, context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	if e.IsStopped() {
		var none Resp
		return none, fmt.Errorf("endpoint %s (%s) has been stopped: %w", e.resource, e.socket, ErrStopped)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return rpc(e.client, ctx, req)
}

// Allocate asks the plugin to allocate devices for one container, within
// CallTimeout.
func (e *Endpoint) Allocate(ctx context.Context, deviceIDs []string) (*pluginapi.AllocateResponse, error) {
	return call(ctx, e, e.opts.CallTimeout, pluginapi.DevicePluginClient.Allocate, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: deviceIDs}},
	})
}

// PreStartContainer tells the plugin a container with these devices is about
// to start, within PreStartTimeout.
func (e *Endpoint) PreStartContainer(ctx context.Context, deviceIDs []string) (*pluginapi.PreStartContainerResponse, error) {
	return call(ctx, e, e.opts.PreStartTimeout, pluginapi.DevicePluginClient.PreStartContainer,
		&pluginapi.PreStartContainerRequest{DevicesIds: deviceIDs})
}

// GetPreferredAllocation asks the plugin which size devices it prefers among
// available, including mustInclude, within CallTimeout.
func (e *Endpoint) GetPreferredAllocation(ctx context.Context, available, mustInclude []string, size int) (*pluginapi.PreferredAllocationResponse, error) {
	req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs:   available,
		MustIncludeDeviceIDs: mustInclude,
		AllocationSize:       int32(size),
	}}}
	return call(ctx, e, e.opts.CallTimeout, pluginapi.DevicePluginClient.GetPreferredAllocation, req)
}
