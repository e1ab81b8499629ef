package devicemanager

import (
	"fmt"
	"slices"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/endpoint"
)

// A plugin's device lists: each ListAndWatch message, from its stream or
// handed in by an embedder, replaces the resource's list.

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
	if r := m.core.resources[resourceName]; r != nil && len(r.instances) > 0 {
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
	eff, changed, healthy, ok := m.core.applyDevices(resource, ep, devs)
	m.signal(eff)
	m.mu.Unlock()
	if !ok {
		return // a replaced or disconnected instance
	}
	m.log.V(2).Info("Device plugin reported devices", keyResource, resource, keySocket, ep.SocketPath(),
		keyCount, len(devs), keyHealthy, healthy, "changed", changed)
	m.persistFor(eff, "after a device update of "+resource)
}

// applyDevices makes devs the device list of resource, as sent by ep; ok
// is false, and nothing changes, when ep is not a connected instance of
// it. It returns the number of devices that are new or changed health, and
// of devices that count as healthy. The owners of the devices whose health
// changed are notified, in device ID order; a change of the healthy set is
// a change of the checkpoint; a resource that was not ready or listed no
// device wakes the admissions waiting for it.
func (c *core) applyDevices(resource string, ep *endpoint.Endpoint, devs []*pluginapi.Device) (eff effects, changed, healthy int, ok bool) {
	r := c.resources[resource]
	if r == nil || !r.current(ep) {
		return effects{}, 0, 0, false
	}
	eff.ready = !r.ready() || r.listsNothing()
	ids, healthyChanged := r.setDevices(devs)
	if c.ledger.AllocatedCount(resource) > 0 {
		slices.Sort(ids)
		for _, id := range ids {
			for _, ref := range c.ledger.Owners(resource, id) {
				eff.notify = append(eff.notify, ref.PodUID)
			}
		}
	}
	if healthyChanged {
		eff.merge(c.changed())
	}
	return eff, len(ids), r.healthyLen(), true
}

// refuseDevices disconnects the instance ep, whose list of n devices is over
// MaxDevicesPerResource, as gRPC ends a stream whose message is over
// MaxRecvMsgSize: the list is not applied, the resource's devices stay in
// capacity (unhealthy if ep was its last instance, for the grace period) and
// every allocation stays. The plugin sees its stream end.
func (m *ManagerImpl) refuseDevices(resource string, ep *endpoint.Endpoint, n int) {
	m.mu.Lock()
	r := m.core.resources[resource]
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
