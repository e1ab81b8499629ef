package devicemanager

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/endpoint"
	"github.com/openkubelet/devmgr/internal/pluginreg"
)

// registrationServer is the Registration gRPC service on kubelet.sock.
type registrationServer struct {
	pluginapi.UnimplementedRegistrationServer
	m *ManagerImpl
}

// Register validates the request, dials the plugin back and starts following
// its devices. The plugin must already serve its DevicePlugin service.
// req.Options is ignored: options are always fetched from the plugin.
func (s *registrationServer) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	m := s.m
	defer m.countRegistration(req.ResourceName)
	log := m.log.WithValues(keyResource, req.ResourceName)
	log.V(2).Info("Got registration request from device plugin", keyVersion, req.Version, "endpoint", req.Endpoint)
	if err := pluginreg.CheckVersion(req.Version); err != nil {
		log.Error(err, "Refused device plugin registration")
		return &pluginapi.Empty{}, err
	}
	if err := pluginreg.CheckResourceName(req.ResourceName); err != nil {
		log.Error(err, "Refused device plugin registration")
		return &pluginapi.Empty{}, err
	}
	path, err := pluginreg.EndpointPath(m.opts.SocketDir, req.Endpoint)
	if err != nil {
		log.Error(err, "Refused device plugin registration")
		return &pluginapi.Empty{}, err
	}
	if err := m.connect(ctx, req.ResourceName, path); err != nil {
		log.Error(err, "Failed to register device plugin", keySocket, path)
		if errors.Is(err, ErrPluginLimit) {
			return &pluginapi.Empty{}, status.Error(codes.ResourceExhausted, err.Error())
		}
		// Plain status Unknown, as the kubelet answers: the status of the
		// dial-back (say DeadlineExceeded) is not the status of Register.
		return &pluginapi.Empty{}, status.Error(codes.Unknown, err.Error())
	}
	return &pluginapi.Empty{}, nil
}

// countRegistration counts one Register request under its resource name
// when that names a resource the manager holds once the request is handled,
// and otherwise under a fixed label value, so that requests with ever new
// names cannot add series without bound.
func (m *ManagerImpl) countRegistration(name string) {
	label := registrationInvalid
	if pluginreg.IsExtendedResourceName(name) {
		m.mu.Lock()
		_, held := m.resources[name]
		m.mu.Unlock()
		label = name
		if !held {
			label = registrationUnknown
		}
	}
	m.metrics.registrations.WithLabelValues(label).Inc()
}

// connect dials the plugin instance at path and makes it the primary
// endpoint of resource. An instance already connected on the same socket is
// replaced (the plugin restarted); instances on other sockets stay. No lock is
// held while dialling, so one slow plugin never delays another's registration.
func (m *ManagerImpl) connect(ctx context.Context, resource, path string) error {
	_, err := m.connectWith(ctx, resource, path, m.opts.endpointOptions())
	return err
}

// connectWith is connect with the endpoint's options (a dialer for a local
// resource); it returns the connected endpoint.
func (m *ManagerImpl) connectWith(ctx context.Context, resource, path string, opts endpoint.Options) (*endpoint.Endpoint, error) {
	// The limits are checked before the dial, to spare it, and again once
	// the lock is taken again, since other registrations may have come
	// meanwhile.
	m.mu.Lock()
	err := m.admitLocked(resource, path)
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	ep, err := endpoint.Dial(ctx, resource, path, opts)
	if err != nil {
		m.metrics.rpcErrors.WithLabelValues(resource, methodGetDevicePluginOptions).Inc()
		return nil, err
	}
	// Stop may have run while the plugin was dialled: then the new endpoint
	// is dropped, and no follower starts after Stop.
	m.mu.Lock()
	if m.state != started {
		m.mu.Unlock()
		ep.Stop()
		return nil, ErrStopped
	}
	if err := m.admitLocked(resource, path); err != nil {
		m.mu.Unlock()
		ep.Stop()
		return nil, err
	}
	r := m.resourceLocked(resource)
	old := r.instances[path]
	m.connSeq++
	r.instances[path] = &instance{ep: ep, seq: m.connSeq}
	r.primary = ep
	m.wg.Add(1)
	m.mu.Unlock()

	if old != nil {
		m.log.V(2).Info("Device plugin re-registered on the same socket, replacing its old connection",
			keyResource, resource, keySocket, path)
		old.ep.Stop()
	}
	m.log.V(2).Info("Registered device plugin", keyResource, resource, keySocket, path,
		"preStartRequired", ep.Options().GetPreStartRequired(),
		"getPreferredAllocationAvailable", ep.Options().GetGetPreferredAllocationAvailable())
	go m.follow(resource, ep)
	return ep, nil
}

// admitLocked returns an ErrPluginLimit error, and counts it, when an
// instance of resource on path would be one resource more than MaxResources
// or one instance more than MaxInstancesPerResource. Expects m.mu held.
func (m *ManagerImpl) admitLocked(resource, path string) error {
	r := m.resources[resource]
	if r == nil || !r.served() {
		n := 0
		for _, other := range m.resources {
			if other.served() {
				n++
			}
		}
		if n < m.opts.MaxResources {
			return nil
		}
		m.metrics.refused.WithLabelValues("", reasonResources).Inc()
		return fmt.Errorf("%w: resource %q refused: plugins serve %d resources, the limit (MaxResources) is %d",
			ErrPluginLimit, resource, n, m.opts.MaxResources)
	}
	if _, again := r.instances[path]; again || len(r.instances) < m.opts.MaxInstancesPerResource {
		return nil
	}
	m.metrics.refused.WithLabelValues(resource, reasonInstances).Inc()
	return fmt.Errorf("%w: resource %q refused an instance on %s: %d instances are connected, the limit (MaxInstancesPerResource) is %d",
		ErrPluginLimit, resource, path, len(r.instances), m.opts.MaxInstancesPerResource)
}

// follow runs the ListAndWatch stream of one plugin instance until it ends,
// then disconnects the instance. The plugin must register again to come back.
// The end is logged once the instance is disconnected, so that whoever reads
// the log finds the manager's state past it.
func (m *ManagerImpl) follow(resource string, ep *endpoint.Endpoint) {
	defer m.wg.Done()
	err := ep.Run(m.ctx, func(msg *pluginapi.ListAndWatchResponse) {
		m.onDevices(resource, ep, msg.GetDevices())
		// Measured after the list is applied, so as not to delay it.
		m.metrics.messageBytes.WithLabelValues(resource).Observe(float64(proto.Size(msg)))
	})
	m.disconnect(resource, ep)
	switch {
	case errors.Is(err, endpoint.ErrStopped):
		// Replaced (a re-registration) or stopped before its stream opened.
		m.log.V(2).Info("Device plugin instance stopped before its stream opened", keyResource, resource, keySocket, ep.SocketPath())
	case err != nil:
		m.metrics.rpcErrors.WithLabelValues(resource, methodListAndWatch).Inc()
		m.log.Error(err, "ListAndWatch ended unexpectedly for device plugin", keyResource, resource, keySocket, ep.SocketPath())
	}
}

// PluginListAndWatchReceiver applies one ListAndWatch message for
// resourceName as if the resource's primary plugin instance had sent it on
// its stream: the kubelet's entry point of that name, for an embedder that
// relays a plugin's device lists itself, and for tests and benchmarks that
// drive the manager without gRPC. Exactly what a message on the stream does
// happens before it returns: the device list and health are replaced, the
// owners of devices whose health changed are sent on Updates, and the
// checkpoint is written if its content changed. The plugin's own stream keeps
// applying its messages; the latest message wins, as in the kubelet.
//
// The manager keeps resp's Device values, as the kubelet does: the caller
// must not change them afterwards (send new values instead).
//
// Unlike the kubelet, a list for a resource with no connected plugin instance
// (never registered, or its last plugin gone) is ignored, and so is a nil
// response: devices nobody serves cannot become healthy. So is a list before
// Start or after Stop; Stop waits for calls in progress, so no checkpoint is
// written after it returns. A list over MaxDevicesPerResource disconnects
// the primary instance, as it would on the stream. logger receives the
// message saying a list was ignored; the rest is logged as for the stream,
// to Options.Logger.
func (m *ManagerImpl) PluginListAndWatchReceiver(logger klog.Logger, resourceName string, resp *pluginapi.ListAndWatchResponse) {
	if resp == nil {
		logger.Error(nil, "Ignoring a nil ListAndWatch response", keyResource, resourceName)
		return
	}
	m.mu.Lock()
	if m.state != started {
		m.mu.Unlock()
		logger.Info("Ignoring a device list: the device manager is not running", keyResource, resourceName)
		return
	}
	// Stop waits for this call as for a stream's, so that no checkpoint is
	// written after Stop returns.
	m.wg.Add(1)
	defer m.wg.Done()
	var ep *endpoint.Endpoint
	if r := m.resources[resourceName]; r != nil && len(r.instances) > 0 {
		ep = r.primary
	}
	m.mu.Unlock()
	if ep == nil {
		logger.Info("Ignoring a device list for a resource with no connected device plugin", keyResource, resourceName,
			keyCount, len(resp.GetDevices()))
		return
	}
	// Should the instance disconnect in between, onDevices drops the list,
	// as it drops a late message from that instance's stream.
	m.onDevices(resourceName, ep, resp.GetDevices())
}

// onDevices applies one ListAndWatch message of ep: the device list of the
// resource becomes exactly the message's. Owners of devices whose health
// changed are notified, and the checkpoint is written if its content
// changed. A list over MaxDevicesPerResource disconnects ep instead.
func (m *ManagerImpl) onDevices(resource string, ep *endpoint.Endpoint, devs []*pluginapi.Device) {
	if len(devs) > m.opts.MaxDevicesPerResource {
		m.refuseDevices(resource, ep, len(devs))
		return
	}
	m.mu.Lock()
	r := m.resources[resource]
	if r == nil || !r.current(ep) {
		m.mu.Unlock()
		return // a replaced or disconnected instance
	}
	wake := !r.ready() || r.listsNothing()
	changed, healthyChanged := r.setDevices(devs)
	if wake {
		m.readyChangedLocked()
	}
	healthy := r.healthyLen()
	// The owners of changed devices, in device ID order.
	var owners []string
	if m.ledger.AllocatedCount(resource) > 0 {
		slices.Sort(changed)
		for _, id := range changed {
			for _, ref := range m.ledger.Owners(resource, id) {
				owners = append(owners, ref.PodUID)
			}
		}
	}
	gen := m.gen
	if healthyChanged {
		m.gen++
		gen = m.gen
	}
	// Queued before the change is visible: whoever sees the new health
	// (GetCapacity, say) finds its owners already on their way to Updates.
	if len(owners) > 0 {
		m.updates.push(ResourceUpdate{PodUIDs: owners})
	}
	m.mu.Unlock()

	m.log.V(2).Info("Device plugin reported devices", keyResource, resource, keySocket, ep.SocketPath(),
		keyCount, len(devs), keyHealthy, healthy, "changed", len(changed))
	if healthyChanged {
		if err := m.persist(gen); err != nil {
			m.log.Error(err, "Failed to write checkpoint after a device update", keyResource, resource)
		}
	}
}

// refuseDevices disconnects the instance ep, whose list of n devices is over
// MaxDevicesPerResource, as gRPC ends a stream whose message is over
// MaxRecvMsgSize: the list is not applied, the resource's devices stay in
// capacity (unhealthy if ep was its last instance, for the grace period) and
// every allocation stays. The plugin sees its stream end.
func (m *ManagerImpl) refuseDevices(resource string, ep *endpoint.Endpoint, n int) {
	m.mu.Lock()
	r := m.resources[resource]
	current := r != nil && r.current(ep)
	m.mu.Unlock()
	if !current {
		return // a replaced or disconnected instance
	}
	m.metrics.refused.WithLabelValues(resource, reasonDevices).Inc()
	m.log.Error(fmt.Errorf("%w: resource %q: ListAndWatch listed %d devices, the limit (MaxDevicesPerResource) is %d",
		ErrPluginLimit, resource, n, m.opts.MaxDevicesPerResource),
		"Disconnecting device plugin: its device list is not applied", keyResource, resource, keySocket, ep.SocketPath())
	m.disconnect(resource, ep)
}

// disconnect removes a plugin instance whose stream ended. When it was the
// last instance, the resource's devices become unhealthy and the stopped
// endpoint stays primary, so the resource remains visible for the grace
// period. The checkpoint is not written.
func (m *ManagerImpl) disconnect(resource string, ep *endpoint.Endpoint) {
	ep.Stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.resources[resource]
	if r == nil || !r.current(ep) {
		return // replaced by a newer registration on the same socket
	}
	delete(r.instances, ep.SocketPath())
	if len(r.instances) == 0 {
		r.markUnhealthy()
		m.log.V(2).Info("Device plugin disconnected; its devices are unhealthy until it registers again",
			keyResource, resource, keySocket, ep.SocketPath())
		return
	}
	if r.primary == ep {
		r.primary = newestInstance(r.instances)
	}
	m.log.V(2).Info("Device plugin instance disconnected", keyResource, resource, keySocket, ep.SocketPath(),
		"primary", r.primary.SocketPath())
}

// newestInstance picks the instance registered last, so that promotion after
// a disconnect is deterministic (the kubelet picks an arbitrary one).
func newestInstance(instances map[string]*instance) *endpoint.Endpoint {
	var best *instance
	for _, in := range instances {
		if best == nil || in.seq > best.seq {
			best = in
		}
	}
	return best.ep
}

// watcherHandler is the plugin-registry path of registration.
type watcherHandler struct{ m *ManagerImpl }

// GetWatcherHandler returns the handler a plugin-registry watcher calls for
// plugins of type DevicePlugin.
func (m *ManagerImpl) GetWatcherHandler() PluginHandler { return watcherHandler{m: m} }

func (h watcherHandler) ValidatePlugin(pluginName, _ string, versions []string) error {
	if !slices.ContainsFunc(versions, func(v string) bool { return slices.Contains(pluginreg.SupportedVersions, v) }) {
		return fmt.Errorf("manager version, %s, is not among plugin supported versions %v", pluginapi.Version, versions)
	}
	if err := pluginreg.CheckResourceName(pluginName); err != nil {
		return fmt.Errorf("invalid name of device plugin socket: %w", err)
	}
	return nil
}

func (h watcherHandler) RegisterPlugin(pluginName, endpointPath string, _ []string, timeout *time.Duration) error {
	if !filepath.IsAbs(endpointPath) {
		return fmt.Errorf("invalid endpoint %q: the plugin registry path needs an absolute socket path", endpointPath)
	}
	ctx := h.m.ctx
	if timeout != nil && *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	return h.m.connect(ctx, pluginName, endpointPath)
}

func (h watcherHandler) DeRegisterPlugin(pluginName, endpointPath string) {
	m := h.m
	m.mu.Lock()
	var in *instance
	if r := m.resources[pluginName]; r != nil {
		in = r.instances[endpointPath]
	}
	m.mu.Unlock()
	if in == nil {
		return
	}
	m.log.V(2).Info("Deregistering device plugin", keyResource, pluginName, keySocket, endpointPath)
	// Stopping ends the stream; follow then disconnects the instance.
	in.ep.Stop()
}
