// Package kubeletcompat puts devmgr behind the kubelet's own device manager
// interface (k8s.io/kubernetes v1.37, pkg/kubelet/cm/devicemanager.Manager)
// and topologymanager.HintProvider, so that a kubelet fork or an agent that
// vendors the kubelet's container manager can use devmgr in place of the
// kubelet's ManagerImpl.
//
// Every method answers as the kubelet's does: Allocate allocates only for an
// add operation (a resize allocates nothing), and the hints ignore the
// operation; AllocatePod allocates nothing, since the kubelet's device
// manager has no pod-level allocation; the health checker fails only while
// the registration server has failed; the Updates channel is never closed.
// The loggers the interface passes are not used: the manager logs through
// devicemanager.Options.Logger. Where devmgr deliberately differs from the
// kubelet, so does the adapter: for one, a resource whose plugin is connected
// but has not listed its devices yet refuses the container
// (devicemanager.ErrPluginNotReady), where the kubelet starts it without
// the device.
//
// This package is a module of its own, so that devmgr itself never depends on
// k8s.io/kubernetes.
package kubeletcompat

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	kubeletdm "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/resourceupdates"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	schedulerframework "k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/topology"
)

var (
	_ kubeletdm.Manager            = (*Manager)(nil)
	_ topologymanager.HintProvider = (*Manager)(nil)
)

// Manager is devmgr's ManagerImpl with the kubelet's method set. Its methods
// are safe for concurrent use.
type Manager struct {
	impl    *devicemanager.ManagerImpl
	updates chan resourceupdates.Update

	mu      sync.Mutex
	started bool
	stopped bool
	stop    chan struct{}
	relay   sync.WaitGroup
}

// New returns a Manager backed by a devmgr ManagerImpl made with opts. When
// store is not nil it gives the NUMA affinity of each container (the
// kubelet's topology manager, as the kubelet passes it to its device
// manager), and opts.AffinityStore is replaced by it.
func New(opts devicemanager.Options, store topologymanager.Store) (*Manager, error) {
	if store != nil {
		opts.AffinityStore = affinityStore{store: store, log: opts.Logger}
	}
	impl, err := devicemanager.NewManagerImpl(opts)
	if err != nil {
		return nil, err
	}
	return &Manager{
		impl:    impl,
		updates: make(chan resourceupdates.Update),
		stop:    make(chan struct{}),
	}, nil
}

// Impl returns the devmgr manager behind m, for what the kubelet's interface
// has no method for (Status, PluginListAndWatchReceiver, metrics).
func (m *Manager) Impl() *devicemanager.ManagerImpl { return m.impl }

// Start restores the checkpoint and starts serving kubelet.sock, as
// devicemanager.ManagerImpl.Start does with the same arguments converted.
func (m *Manager) Start(_ klog.Logger, activePods kubeletdm.ActivePodsFunc, sourcesReady config.SourcesReady,
	initialContainers containermap.ContainerMap, initialContainerRunningSet sets.Set[string]) error {
	var pods devicemanager.ActivePodsFunc
	if activePods != nil {
		pods = devicemanager.ActivePodsFunc(activePods)
	}
	var ready devicemanager.SourcesReady
	if sourcesReady != nil {
		ready = sourcesReady
	}
	if err := m.impl.Start(pods, ready, containerMap(initialContainers), initialContainerRunningSet); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped { // Stop ran meanwhile
		return devicemanager.ErrStopped
	}
	m.started = true
	m.relay.Add(1)
	go m.relayUpdates()
	return nil
}

// relayUpdates passes devmgr's updates on to the kubelet's channel until
// Stop. devmgr merges what arrives while one waits here, so nothing is lost.
func (m *Manager) relayUpdates() {
	defer m.relay.Done()
	for {
		select {
		case u, ok := <-m.impl.Updates():
			if !ok {
				return
			}
			select {
			case m.updates <- resourceupdates.Update{PodUIDs: u.PodUIDs}:
			case <-m.stop:
				return
			}
		case <-m.stop:
			return
		}
	}
}

// Stop disconnects the plugins and stops serving kubelet.sock. It is
// idempotent and safe before Start.
func (m *Manager) Stop(klog.Logger) error {
	err := m.impl.Stop()
	m.mu.Lock()
	if !m.stopped {
		m.stopped = true
		close(m.stop)
	}
	m.mu.Unlock()
	m.relay.Wait()
	return err
}

// Allocate allocates the container's devices for an add operation, and
// nothing for any other (a resize keeps the devices the container holds).
func (m *Manager) Allocate(ctx context.Context, pod *v1.Pod, container *v1.Container, operation lifecycle.Operation) error {
	if operation != lifecycle.AddOperation {
		return nil
	}
	return m.impl.Allocate(ctx, pod, container)
}

// AllocatePod allocates nothing: devices are allocated per container.
func (m *Manager) AllocatePod(klog.Logger, *v1.Pod, lifecycle.Operation) error { return nil }

// UpdatePluginResources raises node's allocatable, per device resource, to
// the number of devices allocated node-wide when the pod being admitted
// holds devices, so that pods already bound keep passing admission after a
// plugin failure. node.Allocatable is replaced, never modified.
func (m *Manager) UpdatePluginResources(node *schedulerframework.NodeInfo, attrs *lifecycle.PodAdmitAttributes) error {
	if node == nil || attrs == nil || attrs.Pod == nil {
		return nil
	}
	have := v1.ResourceList{}
	if node.Allocatable != nil {
		for name, n := range node.Allocatable.ScalarResources {
			have[name] = *resource.NewQuantity(n, resource.DecimalSI)
		}
	}
	want := m.impl.UpdatePluginResources(have, attrs.Pod)
	var raised *schedulerframework.Resource
	for name, q := range want {
		if old, ok := have[name]; ok && old.Cmp(q) == 0 {
			continue
		}
		if raised == nil {
			raised = &schedulerframework.Resource{}
			if node.Allocatable != nil {
				raised = node.Allocatable.Clone()
			}
			if raised.ScalarResources == nil {
				raised.ScalarResources = map[v1.ResourceName]int64{}
			}
		}
		raised.ScalarResources[name] = q.Value()
	}
	if raised != nil {
		node.Allocatable = raised
	}
	return nil
}

// GetDeviceRunContainerOptions returns the runtime settings of the
// container's devices (calling PreStartContainer where a plugin asks for
// it, and allocating again a container of an active pod whose devices were
// lost); nil when it holds none.
func (m *Manager) GetDeviceRunContainerOptions(ctx context.Context, pod *v1.Pod, container *v1.Container) (*kubeletdm.DeviceRunContainerOptions, error) {
	opts, err := m.impl.GetDeviceRunContainerOptions(ctx, pod, container)
	if err != nil {
		return nil, err
	}
	return runOptions(opts), nil
}

// GetCapacity returns capacity, allocatable and the resources removed since
// the last call.
func (m *Manager) GetCapacity(klog.Logger) (v1.ResourceList, v1.ResourceList, []string) {
	return m.impl.GetCapacity()
}

// GetWatcherHandler returns the handler the kubelet's plugin watcher calls
// for plugins of type DevicePlugin.
func (m *Manager) GetWatcherHandler() cache.PluginHandler {
	return watcherHandler{h: m.impl.GetWatcherHandler()}
}

// GetHealthChecker returns the kubelet's "device-plugin" health check.
func (m *Manager) GetHealthChecker() healthz.HealthChecker { return healthChecker{m: m} }

// GetDevices returns the devices allocated to the container, by resource.
func (m *Manager) GetDevices(podUID, containerName string) kubeletdm.ResourceDeviceInstances {
	return resourceDevices(m.impl.GetDevices(podUID, containerName))
}

// UpdateAllocatedResourcesStatus sets the health of the devices allocated to
// each container of status.
func (m *Manager) UpdateAllocatedResourcesStatus(_ klog.Logger, pod *v1.Pod, status *v1.PodStatus) {
	m.impl.UpdateAllocatedResourcesStatus(pod, status)
}

// GetAllocatableDevices returns the healthy devices of every resource.
func (m *Manager) GetAllocatableDevices(klog.Logger) kubeletdm.ResourceDeviceInstances {
	return resourceDevices(m.impl.GetAllocatableDevices())
}

// ShouldResetExtendedResourceCapacity reports whether the checkpoint
// directory holds no checkpoint: the node was recreated.
func (m *Manager) ShouldResetExtendedResourceCapacity() bool {
	return m.impl.ShouldResetExtendedResourceCapacity()
}

// GetTopologyHints returns the NUMA placements that can satisfy each device
// resource of the container.
func (m *Manager) GetTopologyHints(_ klog.Logger, pod *v1.Pod, container *v1.Container, _ lifecycle.Operation) map[string][]topologymanager.TopologyHint {
	return hints(m.impl.GetTopologyHints(pod, container))
}

// GetPodTopologyHints returns the NUMA placements that can satisfy each
// device resource of the whole pod.
func (m *Manager) GetPodTopologyHints(_ klog.Logger, pod *v1.Pod, _ lifecycle.Operation) map[string][]topologymanager.TopologyHint {
	return hints(m.impl.GetPodTopologyHints(pod))
}

// UpdateAllocatedDevices releases the devices of pods no longer active.
func (m *Manager) UpdateAllocatedDevices(klog.Logger) { m.impl.UpdateAllocatedDevices() }

// Updates returns the channel that names pods whose devices changed health.
// It is never closed.
func (m *Manager) Updates() <-chan resourceupdates.Update { return m.updates }

// watcherHandler is devmgr's plugin-watcher handler with the kubelet's
// signatures.
type watcherHandler struct{ h devicemanager.PluginHandler }

func (w watcherHandler) ValidatePlugin(_ context.Context, pluginName, endpoint string, versions []string) error {
	return w.h.ValidatePlugin(pluginName, endpoint, versions)
}

func (w watcherHandler) RegisterPlugin(_ context.Context, pluginName, endpoint string, versions []string, timeout *time.Duration) error {
	return w.h.RegisterPlugin(pluginName, endpoint, versions, timeout)
}

func (w watcherHandler) DeRegisterPlugin(_ context.Context, pluginName, endpoint string) {
	w.h.DeRegisterPlugin(pluginName, endpoint)
}

// healthChecker fails while the registration server of a started manager
// has failed; before Start and after Stop it passes, as the kubelet's, whose
// Stop counts a stopped manager as healthy whatever failed before.
type healthChecker struct{ m *Manager }

func (healthChecker) Name() string { return "device-plugin" }

func (h healthChecker) Check(*http.Request) error {
	h.m.mu.Lock()
	serving := h.m.started && !h.m.stopped
	h.m.mu.Unlock()
	if !serving {
		return nil
	}
	if err := h.m.impl.HealthCheck(); err != nil && !errors.Is(err, devicemanager.ErrStopped) {
		return err
	}
	return nil
}

// affinityStore gives devmgr the affinity the kubelet's topology manager
// chose.
type affinityStore struct {
	store topologymanager.Store
	log   klog.Logger
}

func (s affinityStore) GetAffinity(podUID, containerName string) topology.Hint {
	return fromKubeletHint(s.store.GetAffinity(s.log, podUID, containerName))
}
