package blackbox_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakePlugin is a device plugin written for this suite: a gRPC DevicePlugin
// server on a unix socket that records every call it gets and lets a test
// script its answers.
type fakePlugin struct {
	pluginapi.UnimplementedDevicePluginServer

	resource string
	sock     string // absolute socket path
	srv      *grpc.Server
	done     chan struct{}
	stopOnce sync.Once
	serveWG  sync.WaitGroup

	mu           sync.Mutex
	opts         *pluginapi.DevicePluginOptions
	optsErr      error
	devices      []*pluginapi.Device
	watchers     map[chan struct{}]struct{}
	endCh        chan struct{} // closed by endStreams
	streams      int           // ListAndWatch streams opened so far
	optsCalls    int
	allocReqs    []*pluginapi.AllocateRequest
	prefReqs     []*pluginapi.PreferredAllocationRequest
	preStartReqs []*pluginapi.PreStartContainerRequest

	// Hooks; nil means the default behaviour.
	allocateFn  func(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error)
	preferredFn func(ctx context.Context, req *pluginapi.ContainerPreferredAllocationRequest) ([]string, error)
	preStartFn  func(ctx context.Context, req *pluginapi.PreStartContainerRequest) error
}

// newFakePlugin creates a plugin that will serve on dir/name. It is not
// serving until start is called.
func newFakePlugin(t *testing.T, dir, name, resource string, opts *pluginapi.DevicePluginOptions, devs ...*pluginapi.Device) *fakePlugin {
	t.Helper()
	if opts == nil {
		opts = &pluginapi.DevicePluginOptions{}
	}
	return &fakePlugin{
		resource: resource,
		sock:     filepath.Join(dir, name),
		done:     make(chan struct{}),
		opts:     opts,
		devices:  cloneDevices(devs),
		watchers: map[chan struct{}]struct{}{},
		endCh:    make(chan struct{}),
	}
}

// start serves the DevicePlugin service; the plugin is stopped at cleanup.
func (p *fakePlugin) start(t *testing.T) {
	t.Helper()
	lis, err := net.Listen("unix", p.sock)
	require.NoError(t, err)
	p.srv = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(p.srv, p)
	p.serveWG.Add(1)
	go func() {
		defer p.serveWG.Done()
		_ = p.srv.Serve(lis)
	}()
	t.Cleanup(p.stop)
}

// stop ends every ListAndWatch stream and the server; the socket file is
// removed. Idempotent.
func (p *fakePlugin) stop() {
	p.stopOnce.Do(func() {
		close(p.done)
		if p.srv != nil {
			p.srv.Stop()
			p.serveWG.Wait()
		}
		_ = os.Remove(p.sock)
	})
}

// endpointName is the bare file name sent as RegisterRequest.Endpoint.
func (p *fakePlugin) endpointName() string { return filepath.Base(p.sock) }

// update replaces the device list and pushes it on every open stream.
func (p *fakePlugin) update(devs ...*pluginapi.Device) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devices = cloneDevices(devs)
	for ch := range p.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// endStreams ends every open ListAndWatch stream; the server keeps serving.
func (p *fakePlugin) endStreams() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.endCh)
	p.endCh = make(chan struct{})
}

func (p *fakePlugin) openStreams() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.watchers)
}

func (p *fakePlugin) setAllocate(fn func(context.Context, *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.allocateFn = fn
}

func (p *fakePlugin) setPreferred(fn func(context.Context, *pluginapi.ContainerPreferredAllocationRequest) ([]string, error)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.preferredFn = fn
}

func (p *fakePlugin) setPreStart(fn func(context.Context, *pluginapi.PreStartContainerRequest) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.preStartFn = fn
}

func (p *fakePlugin) allocateCalls() []*pluginapi.AllocateRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.allocReqs)
}

func (p *fakePlugin) preferredCalls() []*pluginapi.PreferredAllocationRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.prefReqs)
}

func (p *fakePlugin) preStartCalls() []*pluginapi.PreStartContainerRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.preStartReqs)
}

func (p *fakePlugin) optionCalls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.optsCalls
}

func (p *fakePlugin) streamCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.streams
}

// GetDevicePluginOptions implements DevicePluginServer.
func (p *fakePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.optsCalls++
	if p.optsErr != nil {
		return nil, p.optsErr
	}
	return proto.Clone(p.opts).(*pluginapi.DevicePluginOptions), nil
}

// ListAndWatch implements DevicePluginServer: the full list at once, then
// again after every update, until the stream or the plugin ends.
func (p *fakePlugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	ch := make(chan struct{}, 1)
	p.mu.Lock()
	p.watchers[ch] = struct{}{}
	p.streams++
	devs := cloneDevices(p.devices)
	end := p.endCh
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.watchers, ch)
		p.mu.Unlock()
	}()
	for {
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-s.Context().Done():
			return nil
		case <-p.done:
			return nil
		case <-end:
			return status.Error(codes.Unavailable, "stream ended by the test")
		case <-ch:
			p.mu.Lock()
			devs = cloneDevices(p.devices)
			p.mu.Unlock()
		}
	}
}

// GetPreferredAllocation implements DevicePluginServer.
func (p *fakePlugin) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	p.mu.Lock()
	p.prefReqs = append(p.prefReqs, proto.Clone(req).(*pluginapi.PreferredAllocationRequest))
	fn := p.preferredFn
	p.mu.Unlock()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		var ids []string
		if fn != nil {
			var err error
			if ids, err = fn(ctx, cr); err != nil {
				return nil, err
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate implements DevicePluginServer. By default every container gets
// one env ALLOC_<resource-free index> listing its devices.
func (p *fakePlugin) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	p.mu.Lock()
	p.allocReqs = append(p.allocReqs, proto.Clone(req).(*pluginapi.AllocateRequest))
	fn := p.allocateFn
	p.mu.Unlock()
	if fn != nil {
		return fn(ctx, req)
	}
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		ids := slices.Clone(cr.GetDevicesIds())
		slices.Sort(ids)
		env := ""
		for i, id := range ids {
			if i > 0 {
				env += ","
			}
			env += id
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"DEVICES_" + sanitize(p.resource): env},
		})
	}
	return resp, nil
}

// PreStartContainer implements DevicePluginServer.
func (p *fakePlugin) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	p.mu.Lock()
	p.preStartReqs = append(p.preStartReqs, proto.Clone(req).(*pluginapi.PreStartContainerRequest))
	fn := p.preStartFn
	p.mu.Unlock()
	if fn != nil {
		if err := fn(ctx, req); err != nil {
			return nil, err
		}
	}
	return &pluginapi.PreStartContainerResponse{}, nil
}

func sanitize(s string) string {
	out := []byte(s)
	for i, c := range out {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			out[i] = '_'
		}
	}
	return string(out)
}

func cloneDevices(devs []*pluginapi.Device) []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(devs))
	for _, d := range devs {
		out = append(out, proto.Clone(d).(*pluginapi.Device))
	}
	return out
}

// dev builds a device; numa nodes give it a topology, none leaves it nil.
func dev(id, health string, numa ...int64) *pluginapi.Device {
	d := &pluginapi.Device{ID: id, Health: health}
	if len(numa) > 0 {
		d.Topology = &pluginapi.TopologyInfo{}
		for _, n := range numa {
			d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: n})
		}
	}
	return d
}

func healthy(id string, numa ...int64) *pluginapi.Device {
	return dev(id, pluginapi.Healthy, numa...)
}

func unhealthy(id string, numa ...int64) *pluginapi.Device {
	return dev(id, pluginapi.Unhealthy, numa...)
}

// register sends one RegisterRequest to the kubelet socket in socketDir.
func register(t *testing.T, socketDir string, req *pluginapi.RegisterRequest) error {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(socketDir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, req)
	return err
}

// registerPlugin registers p under its own resource name with v1beta1.
func registerPlugin(t *testing.T, socketDir string, p *fakePlugin) error {
	t.Helper()
	return register(t, socketDir, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.endpointName(),
		ResourceName: p.resource,
	})
}
