package podresources

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/openkubelet/devmgr/devicemanager"
)

const (
	// DefaultSocketDir is the kubelet's directory of the podresources socket.
	DefaultSocketDir = "/var/lib/kubelet/pod-resources"
	// SocketName is the file name of the kubelet's podresources socket.
	SocketName = "kubelet.sock"

	// DefaultMaxRecvMsgSize is the largest request the server accepts:
	// gRPC's default, which is what the kubelet's server uses (it sets no
	// limit of its own). Requests are tiny; only Get carries strings.
	DefaultMaxRecvMsgSize = 4 << 20
	// DefaultMaxSendMsgSize is the largest response the server sends. The
	// kubelet sets no send limit; 16 MiB is the receive limit clients of the
	// API use by convention (the kubelet's node e2e tests and the consumers
	// that copied them), so a larger response would be refused by them
	// anyway: devmgr refuses it before sending.
	DefaultMaxSendMsgSize = 16 << 20

	// DefaultQPS is the kubelet's rate limit of the API: calls per second,
	// on average. Options.Limiter takes it, with DefaultBurst, as
	// rate.NewLimiter(DefaultQPS, DefaultBurst) (golang.org/x/time/rate).
	DefaultQPS = 100
	// DefaultBurst is the kubelet's burst: calls at once above DefaultQPS.
	DefaultBurst = 10
)

// ErrLimitExceeded is the error of a call refused by Options.Limiter: gRPC
// code ResourceExhausted with the kubelet's text.
var ErrLimitExceeded = status.Error(codes.ResourceExhausted, "rejected by rate limit")

// DeviceSource provides the devices the server reports. *devicemanager.ManagerImpl
// implements it (and AllocationUpdater). Its methods must be safe for
// concurrent use; the server never modifies what they return.
type DeviceSource interface {
	// GetDevices returns the devices allocated to one container, per
	// resource, with their NUMA nodes; nil for an unknown container.
	GetDevices(podUID, containerName string) devicemanager.ResourceDeviceInstances
	// GetAllocatableDevices returns the healthy devices of every resource.
	GetAllocatableDevices() devicemanager.ResourceDeviceInstances
}

// AllocationUpdater is implemented by a DeviceSource that garbage-collects
// the allocations of pods that are gone. List calls it before reading
// allocations, as the kubelet's List does.
type AllocationUpdater interface {
	UpdateAllocatedDevices()
}

// PodSource provides the pods the server reports: normally the node's
// active pods (the kubelet's List reports active pods only). Pods must be
// safe for concurrent use; the server never modifies the pods it returns.
type PodSource interface {
	Pods() []*v1.Pod
}

// PodsFunc adapts a function to PodSource; a devicemanager.ActivePodsFunc
// converts to it directly.
type PodsFunc func() []*v1.Pod

// Pods calls f.
func (f PodsFunc) Pods() []*v1.Pod { return f() }

// Limiter decides whether a call may proceed now; *rate.Limiter of
// golang.org/x/time/rate implements it. The kubelet allows DefaultQPS calls
// per second with a burst of DefaultBurst.
type Limiter interface {
	Allow() bool
}

// Options configures a Server. The zero value of every field means
// "default".
type Options struct {
	// MaxRecvMsgSize is the largest request, in bytes, the server started by
	// Start accepts. Default DefaultMaxRecvMsgSize.
	MaxRecvMsgSize int
	// MaxSendMsgSize is the largest response, in bytes, the server started by
	// Start sends; a larger one fails with codes.ResourceExhausted. Default
	// DefaultMaxSendMsgSize.
	MaxSendMsgSize int
	// Limiter, when set, is asked before every call; a refused call fails
	// with ErrLimitExceeded. nil: no limit.
	Limiter Limiter
	// Registerer receives the server's Prometheus metrics, the kubelet's
	// kubelet_pod_resources_endpoint_*; nil: no metrics are registered.
	// A call the Limiter refuses counts as a request and an error.
	Registerer prometheus.Registerer
	// Logger is the server's logger. Default klog.Background().
	Logger klog.Logger
}

func (o Options) withDefaults() (Options, error) {
	if o.MaxRecvMsgSize < 0 || o.MaxSendMsgSize < 0 {
		return o, fmt.Errorf("podresources: message size limits must not be negative (receive %d, send %d)",
			o.MaxRecvMsgSize, o.MaxSendMsgSize)
	}
	if o.MaxRecvMsgSize == 0 {
		o.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if o.MaxSendMsgSize == 0 {
		o.MaxSendMsgSize = DefaultMaxSendMsgSize
	}
	if o.Logger.GetSink() == nil {
		o.Logger = klog.Background()
	}
	return o, nil
}

// Server is the PodResourcesLister v1 service of the kubelet, fed by a
// DeviceSource and a PodSource. Create it with NewServer; every method is
// safe for concurrent use.
type Server struct {
	// Immutable after NewServer.
	devices DeviceSource
	pods    PodSource
	opts    Options
	log     klog.Logger
	metrics *metrics

	// mu serialises Start and Stop and guards the fields below. It is held
	// across their socket I/O; no RPC takes it.
	mu      sync.Mutex
	started bool
	stopped bool
	grpc    *grpc.Server // nil until Start
	sock    *ownedSocket // nil until Start
	// wg waits for the Serve goroutine.
	wg sync.WaitGroup
}

// NewServer returns a Server that reports devices from devices and pods from
// pods, and registers its metrics on Options.Registerer. It does not serve
// until Start, or until it is registered on a grpc.Server with Register.
func NewServer(devices DeviceSource, pods PodSource, opts Options) (*Server, error) {
	if devices == nil || pods == nil {
		return nil, errors.New("podresources: a device source and a pod source are required")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("podresources: register metrics: %w", err)
	}
	return &Server{devices: devices, pods: pods, opts: opts, log: opts.Logger, metrics: m}, nil
}

// Register registers the PodResourcesLister v1 service on reg, for an
// embedder that serves it on its own grpc.Server. The message size limits of
// Options apply only to the server Start creates; the embedder sets its own.
func (s *Server) Register(reg grpc.ServiceRegistrar) {
	podresourcesv1.RegisterPodResourcesListerServer(reg, service{s: s})
}

// List returns every pod of the PodSource with its restartable init
// containers (sidecars), then its regular containers, in spec order, each
// with its devices. Regular init containers are left out, as by the kubelet:
// their devices, if any, are reported by the containers that reused them.
func (s *Server) List(_ context.Context, _ *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	if err := s.allow(s.metrics.list); err != nil {
		return nil, err
	}
	pods := s.pods.Pods()
	if u, ok := s.devices.(AllocationUpdater); ok {
		u.UpdateAllocatedDevices()
	}
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: make([]*podresourcesv1.PodResources, 0, len(pods))}
	for _, pod := range pods {
		if pod != nil {
			resp.PodResources = append(resp.PodResources, s.podResources(pod))
		}
	}
	return resp, nil
}

// GetAllocatableResources returns every healthy device, allocated or not;
// never an unhealthy one. CPU IDs and memory are left empty: devmgr has no
// CPU or memory manager.
func (s *Server) GetAllocatableResources(_ context.Context, _ *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	if err := s.allow(s.metrics.allocatable); err != nil {
		return nil, err
	}
	return &podresourcesv1.AllocatableResourcesResponse{
		Devices: containerDevices(s.devices.GetAllocatableDevices()),
	}, nil
}

// Get returns one pod of the PodSource, found by namespace and name (the
// first, should the source hold two), as List reports it. An unknown pod
// fails with codes.NotFound.
func (s *Server) Get(_ context.Context, req *podresourcesv1.GetPodResourcesRequest) (*podresourcesv1.GetPodResourcesResponse, error) {
	if err := s.allow(s.metrics.get); err != nil {
		return nil, err
	}
	name, namespace := req.GetPodName(), req.GetPodNamespace()
	for _, pod := range s.pods.Pods() {
		if pod != nil && pod.Name == name && pod.Namespace == namespace {
			return &podresourcesv1.GetPodResourcesResponse{PodResources: s.podResources(pod)}, nil
		}
	}
	s.metrics.get.errors.Inc()
	s.log.V(4).Info("Pod not found", keyPod, klog.KRef(namespace, name))
	return nil, status.Errorf(codes.NotFound, "pod %s in namespace %s not found", name, namespace)
}

// allow logs and counts the call, and asks the limiter.
func (s *Server) allow(m method) error {
	s.log.V(4).Info("Podresources call", keyMethod, m.name)
	s.metrics.total.Inc()
	m.requests.Inc()
	if s.opts.Limiter != nil && !s.opts.Limiter.Allow() {
		m.errors.Inc()
		return ErrLimitExceeded
	}
	return nil
}

// podResources describes one pod. CPU IDs, memory and dynamic resources are
// left empty: devmgr manages devices only.
func (s *Server) podResources(pod *v1.Pod) *podresourcesv1.PodResources {
	names := reportedContainers(pod)
	pr := &podresourcesv1.PodResources{
		Name:       pod.Name,
		Namespace:  pod.Namespace,
		Containers: make([]*podresourcesv1.ContainerResources, 0, len(names)),
	}
	for _, name := range names {
		pr.Containers = append(pr.Containers, &podresourcesv1.ContainerResources{
			Name:    name,
			Devices: containerDevices(s.devices.GetDevices(string(pod.UID), name)),
		})
	}
	return pr
}

// service adapts Server to the generated service interface, keeping the
// embedded UnimplementedPodResourcesListerServer out of Server's API.
type service struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	s *Server
}

func (v service) List(ctx context.Context, req *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	return v.s.List(ctx, req)
}

func (v service) GetAllocatableResources(ctx context.Context, req *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	return v.s.GetAllocatableResources(ctx, req)
}

func (v service) Get(ctx context.Context, req *podresourcesv1.GetPodResourcesRequest) (*podresourcesv1.GetPodResourcesResponse, error) {
	return v.s.Get(ctx, req)
}

// The structured-logging vocabulary of the package.
const (
	keyMethod = "method"
	keyPod    = "pod"
	keySocket = "socketPath"
)
