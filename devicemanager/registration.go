package devicemanager

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
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
		_, held := m.core.resources[name]
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
	err := m.admitInstanceLocked(resource, path)
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
	if err := m.admitInstanceLocked(resource, path); err != nil {
		m.mu.Unlock()
		ep.Stop()
		return nil, err
	}
	old := m.core.connect(resource, path, ep)
	m.wg.Add(1)
	m.mu.Unlock()

	if old != nil {
		m.log.V(2).Info("Device plugin re-registered on the same socket, replacing its old connection",
			keyResource, resource, keySocket, path)
		old.Stop()
	}
	m.log.V(2).Info("Registered device plugin", keyResource, resource, keySocket, path,
		"preStartRequired", ep.Options().GetPreStartRequired(),
		"getPreferredAllocationAvailable", ep.Options().GetGetPreferredAllocationAvailable())
	go m.follow(resource, ep)
	return ep, nil
}

// admitInstanceLocked is core.admitInstance, counting a refusal. Expects
// m.mu held.
func (m *ManagerImpl) admitInstanceLocked(resource, path string) error {
	reason, err := m.core.admitInstance(resource, path)
	if err != nil {
		label := resource
		if reason == reasonResources {
			label = ""
		}
		m.metrics.refused.WithLabelValues(label, reason).Inc()
	}
	return err
}

// admitInstance refuses, with an ErrPluginLimit error and the reason for
// the metric, an instance of resource on path that would be one resource
// more than MaxResources or one instance more than MaxInstancesPerResource.
func (c *core) admitInstance(resource, path string) (reason string, err error) {
	r := c.resources[resource]
	if r == nil || !r.served() {
		n := 0
		for _, other := range c.resources {
			if other.served() {
				n++
			}
		}
		if n < c.maxResources {
			return "", nil
		}
		return reasonResources, fmt.Errorf("%w: resource %q refused: plugins serve %d resources, the limit (MaxResources) is %d",
			ErrPluginLimit, resource, n, c.maxResources)
	}
	if _, again := r.instances[path]; again || len(r.instances) < c.maxInstances {
		return "", nil
	}
	return reasonInstances, fmt.Errorf("%w: resource %q refused an instance on %s: %d instances are connected, the limit (MaxInstancesPerResource) is %d",
		ErrPluginLimit, resource, path, len(r.instances), c.maxInstances)
}

// connect makes ep the instance of resource on path and its primary, and
// returns the instance it replaced on that path, if any.
func (c *core) connect(resource, path string, ep *endpoint.Endpoint) (replaced *endpoint.Endpoint) {
	r := c.resource(resource)
	if old := r.instances[path]; old != nil {
		replaced = old.ep
	}
	c.conns++
	r.instances[path] = &instance{ep: ep, seq: c.conns}
	r.primary = ep
	return replaced
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

// disconnect removes a plugin instance whose stream ended. When it was the
// last instance, the resource's devices become unhealthy and the stopped
// endpoint stays primary, so the resource remains visible for the grace
// period. The checkpoint is not written.
func (m *ManagerImpl) disconnect(resource string, ep *endpoint.Endpoint) {
	ep.Stop()
	m.mu.Lock()
	last, primary, ok := m.core.disconnect(resource, ep)
	m.mu.Unlock()
	switch {
	case !ok: // replaced by a newer registration on the same socket
	case last:
		m.log.V(2).Info("Device plugin disconnected; its devices are unhealthy until it registers again",
			keyResource, resource, keySocket, ep.SocketPath())
	default:
		m.log.V(2).Info("Device plugin instance disconnected", keyResource, resource, keySocket, ep.SocketPath(),
			"primary", primary.SocketPath())
	}
}

// disconnect removes ep, an instance of resource, and returns whether it
// was the last one, and the primary endpoint after; ok is false when ep is
// not the current instance on its socket (replaced, or gone already).
func (c *core) disconnect(resource string, ep *endpoint.Endpoint) (last bool, primary *endpoint.Endpoint, ok bool) {
	r := c.resources[resource]
	if r == nil || !r.current(ep) {
		return false, nil, false
	}
	delete(r.instances, ep.SocketPath())
	if len(r.instances) == 0 {
		r.markUnhealthy()
		return true, r.primary, true
	}
	if r.primary == ep {
		r.primary = newestInstance(r.instances)
	}
	return false, r.primary, true
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
