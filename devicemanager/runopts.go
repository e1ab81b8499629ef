package devicemanager

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

// What the container runtime needs for a container's devices, and the
// PreStartContainer call before it starts.

// GetDeviceRunContainerOptions returns what the runtime needs for the
// container's devices. For each device-plugin resource of the container it
// first calls PreStartContainer when the plugin asked for it; if the
// container of an active pod has no record for a resource (a race at node
// restart), it is allocated again. It returns nil, nil for a container without
// allocations.
func (m *ManagerImpl) GetDeviceRunContainerOptions(ctx context.Context, pod *v1.Pod, container *v1.Container) (*DeviceRunContainerOptions, error) {
	if err := checkRequest(pod, container); err != nil {
		return nil, err
	}
	podUID := string(pod.UID)
	ctx = m.callContext(ctx, pod, container.Name)
	m.mu.Lock()
	activePods := m.podSource.activePods
	m.mu.Unlock()
	// The active pods are read at most once, and only for a container with
	// device-plugin resources.
	isActive := sync.OnceValue(func() bool {
		return slices.ContainsFunc(activePods(), func(p *v1.Pod) bool { return p.UID == pod.UID })
	})

	needsAllocation := false
	for _, name := range sortedResourceNames(container.Resources.Limits) {
		if q := container.Resources.Limits[v1.ResourceName(name)]; q.IsZero() {
			continue
		}
		m.mu.Lock()
		isPlugin := m.core.isDevicePluginResource(name)
		m.mu.Unlock()
		if !isPlugin {
			continue
		}
		if err := m.preStartIfNeeded(ctx, podUID, container.Name, name); err != nil {
			return nil, err
		}
		if !isActive() {
			continue
		}
		m.mu.Lock()
		held := m.core.ledger.ContainerDevices(podUID, container.Name, name)
		m.mu.Unlock()
		if held == nil {
			needsAllocation = true
		}
	}
	if needsAllocation {
		if err := m.Allocate(ctx, pod, container); err != nil {
			return nil, err
		}
	}
	m.mu.Lock()
	opts, conflicts := m.core.ledger.RunOptions(podUID, container.Name)
	m.mu.Unlock()
	for _, c := range conflicts {
		m.log.Error(nil, "Conflicting device settings between resources; the first one wins",
			keyPodUID, podUID, keyContainer, container.Name, keyConflict, c.String())
	}
	return opts, nil
}

// preStartIfNeeded calls PreStartContainer with the container's devices of
// resource when its plugin asked for it.
func (m *ManagerImpl) preStartIfNeeded(ctx context.Context, podUID, container, name string) error {
	m.mu.Lock()
	r := m.core.resources[name]
	if r == nil || r.primary == nil {
		m.mu.Unlock()
		return &admissionError{msg: "endpoint not found in cache for a registered resource: " + name, sentinel: ErrUnknownPlugin}
	}
	ep := r.primary
	if !ep.Options().GetPreStartRequired() {
		m.mu.Unlock()
		return nil
	}
	held := m.core.ledger.ContainerDevices(podUID, container, name)
	m.mu.Unlock()
	if held == nil {
		return fmt.Errorf("no devices found allocated in local cache for pod %s, container %s, resource %s", podUID, container, name)
	}
	ids := sets.List(held)
	m.log.V(4).Info("Issuing PreStartContainer", keyResource, name, keyPodUID, podUID, keyContainer, container, keyDeviceIDs, ids)
	start := time.Now()
	_, err := ep.PreStartContainer(ctx, ids)
	m.metrics.preStart.WithLabelValues(name).Observe(time.Since(start).Seconds())
	if err != nil {
		m.metrics.rpcErrors.WithLabelValues(name, methodPreStartContainer).Inc()
		return pluginCallError("device plugin PreStartContainer rpc failed with err: ", err)
	}
	return nil
}
