package plugintest

import (
	"context"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// AllocateFunc replaces the default Allocate behaviour. It is called with no
// lock held and may call any Plugin method, DefaultAllocate included. A nil
// response with a nil error is sent as an empty response.
type AllocateFunc func(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error)

// PreferredAllocationFunc replaces the default GetPreferredAllocation
// behaviour; the rules of AllocateFunc apply.
type PreferredAllocationFunc func(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error)

// PreStartFunc replaces the default PreStartContainer behaviour; the rules
// of AllocateFunc apply.
type PreStartFunc func(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error)

// OptionsFunc replaces the default GetDevicePluginOptions behaviour; the
// rules of AllocateFunc apply.
type OptionsFunc func(ctx context.Context) (*pluginapi.DevicePluginOptions, error)

// hooks holds the behaviour overrides. Guarded by Plugin.mu.
type hooks struct {
	allocate  AllocateFunc
	preferred PreferredAllocationFunc
	preStart  PreStartFunc
	options   OptionsFunc
}

// SetAllocateFunc replaces the Allocate behaviour for calls that reach it
// from now on; nil restores DefaultAllocate.
func (p *Plugin) SetAllocateFunc(f AllocateFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hooks.allocate = f
}

// SetPreferredAllocationFunc replaces the GetPreferredAllocation behaviour;
// nil restores DefaultPreferredAllocation.
func (p *Plugin) SetPreferredAllocationFunc(f PreferredAllocationFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hooks.preferred = f
}

// SetPreStartFunc replaces the PreStartContainer behaviour; nil restores the
// default, an empty response.
func (p *Plugin) SetPreStartFunc(f PreStartFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hooks.preStart = f
}

// SetOptionsFunc replaces the GetDevicePluginOptions behaviour; nil restores
// the default, the options given to New.
func (p *Plugin) SetOptionsFunc(f OptionsFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hooks.options = f
}

// DefaultAllocate returns the response Allocate gives without an
// AllocateFunc: one ContainerAllocateResponse per container request, in
// order, a pure function of the resource name and the requested device IDs.
// With K the resource name with "/" replaced by "_" (example.com_gpu), E
// "PLUGINTEST_" followed by the resource name upper-cased with every
// character other than A-Z and 0-9 replaced by "_"
// (PLUGINTEST_EXAMPLE_COM_GPU), and the IDs sorted, a request for IDs a, b
// gets:
//
//	Envs:        {E: "a,b"}
//	Annotations: {"plugintest/K": "a,b"}
//	Devices:     {ContainerPath: "/dev/plugintest/K/a", HostPath: "/host/dev/plugintest/K/a", Permissions: "rw"}, same for b
//	Mounts:      {ContainerPath: "/run/plugintest/K/a", HostPath: "/host/run/plugintest/K/a", ReadOnly: true}, same for b
//	CDIDevices:  {Name: Options.CDIDeviceName("a")}, same for b; none when CDIDeviceName is nil
//
// A container request without IDs gets an empty response. The IDs are not
// checked against the device list: Allocate without an AllocateFunc calls
// CheckListed first.
func (p *Plugin) DefaultAllocate(req *pluginapi.AllocateRequest) *pluginapi.AllocateResponse {
	key := strings.ReplaceAll(p.resource, "/", "_")
	env := envName(p.resource)
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		ids := slices.Clone(cr.GetDevicesIds())
		slices.Sort(ids)
		car := &pluginapi.ContainerAllocateResponse{}
		if len(ids) > 0 {
			joined := strings.Join(ids, ",")
			car.Envs = map[string]string{env: joined}
			car.Annotations = map[string]string{"plugintest/" + key: joined}
		}
		for _, id := range ids {
			car.Devices = append(car.Devices, &pluginapi.DeviceSpec{
				ContainerPath: "/dev/plugintest/" + key + "/" + id,
				HostPath:      "/host/dev/plugintest/" + key + "/" + id,
				Permissions:   "rw",
			})
			car.Mounts = append(car.Mounts, &pluginapi.Mount{
				ContainerPath: "/run/plugintest/" + key + "/" + id,
				HostPath:      "/host/run/plugintest/" + key + "/" + id,
				ReadOnly:      true,
			})
			if p.cdiName != nil {
				car.CdiDevices = append(car.CdiDevices, &pluginapi.CDIDevice{Name: p.cdiName(id)})
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, car)
	}
	return resp
}

// CheckListed returns an InvalidArgument status error naming the device IDs
// of req that the Plugin never listed (in Options.Devices or an Update),
// nil when there are none. Allocate without an AllocateFunc refuses such a
// request with it, as a real plugin refuses a device it does not have; an
// AllocateFunc that answers DefaultAllocate alone grants any ID. A device
// an Update removed still counts as listed: a kubelet may allocate from the
// list it had.
func (p *Plugin) CheckListed(req *pluginapi.AllocateRequest) error {
	var unknown []string
	p.mu.Lock()
	for _, cr := range req.GetContainerRequests() {
		for _, id := range cr.GetDevicesIds() {
			if _, ok := p.listed[id]; !ok && !slices.Contains(unknown, id) {
				unknown = append(unknown, id)
			}
		}
	}
	p.mu.Unlock()
	if len(unknown) == 0 {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "plugintest: %s never listed devices %q", p.resource, unknown)
}

// DefaultPreferredAllocation returns the response GetPreferredAllocation
// gives without a PreferredAllocationFunc: per container request, in order,
// the must-include IDs sorted, then the other available IDs sorted, until
// the list holds AllocationSize IDs. Must-include IDs are always all
// returned; duplicates are dropped.
func (p *Plugin) DefaultPreferredAllocation(req *pluginapi.PreferredAllocationRequest) *pluginapi.PreferredAllocationResponse {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		must := sortedUnique(cr.GetMustIncludeDeviceIDs())
		ids := slices.Clone(must)
		for _, id := range sortedUnique(cr.GetAvailableDeviceIDs()) {
			if len(ids) >= int(cr.GetAllocationSize()) {
				break
			}
			if _, found := slices.BinarySearch(must, id); !found {
				ids = append(ids, id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses,
			&pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp
}

// deviceService serves the DevicePlugin gRPC service for a Plugin, keeping
// the RPC methods out of Plugin's API.
type deviceService struct {
	pluginapi.UnimplementedDevicePluginServer
	p *Plugin
}

func (s *deviceService) GetDevicePluginOptions(ctx context.Context, req *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	if err := s.p.enter(ctx, MethodGetDevicePluginOptions, req); err != nil {
		return nil, err
	}
	s.p.mu.Lock()
	f := s.p.hooks.options
	s.p.mu.Unlock()
	if f == nil {
		return proto.CloneOf(s.p.options), nil
	}
	return orEmpty(f(ctx))
}

func (s *deviceService) ListAndWatch(req *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	ctx := stream.Context()
	if err := s.p.enter(ctx, MethodListAndWatch, req); err != nil {
		return err
	}
	w, err := s.p.subscribe()
	if err != nil {
		return errStoppedStatus()
	}
	defer s.p.unsubscribe(w)
	for {
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.p.done:
			return nil
		case <-w.wake:
		}
		msgs, closed := s.p.next(w)
		if closed {
			s.p.logger.V(4).Info("ListAndWatch stream closed by CloseStreams")
			return nil
		}
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}

func (s *deviceService) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	if err := s.p.enter(ctx, MethodGetPreferredAllocation, req); err != nil {
		return nil, err
	}
	s.p.mu.Lock()
	f := s.p.hooks.preferred
	s.p.mu.Unlock()
	if f == nil {
		return s.p.DefaultPreferredAllocation(req), nil
	}
	return orEmpty(f(ctx, req))
}

func (s *deviceService) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	if err := s.p.enter(ctx, MethodAllocate, req); err != nil {
		return nil, err
	}
	s.p.mu.Lock()
	f := s.p.hooks.allocate
	s.p.mu.Unlock()
	if f == nil {
		if err := s.p.CheckListed(req); err != nil {
			return nil, err
		}
		return s.p.DefaultAllocate(req), nil
	}
	return orEmpty(f(ctx, req))
}

func (s *deviceService) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	if err := s.p.enter(ctx, MethodPreStartContainer, req); err != nil {
		return nil, err
	}
	s.p.mu.Lock()
	f := s.p.hooks.preStart
	s.p.mu.Unlock()
	if f == nil {
		return &pluginapi.PreStartContainerResponse{}, nil
	}
	return orEmpty(f(ctx, req))
}

// orEmpty turns a hook's (nil, nil) into an empty message, which gRPC can
// send.
func orEmpty[M interface {
	*T
	proto.Message
}, T any](m M, err error) (M, error) {
	if err == nil && m == nil {
		m = M(new(T))
	}
	return m, err
}

// envName returns the default Allocate environment variable of resource.
func envName(resource string) string {
	var b strings.Builder
	b.WriteString("PLUGINTEST_")
	for _, r := range strings.ToUpper(resource) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

func sortedUnique(ids []string) []string {
	out := slices.Clone(ids)
	slices.Sort(out)
	return slices.Compact(out)
}
