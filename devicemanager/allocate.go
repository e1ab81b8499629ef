package devicemanager

import (
	"context"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/endpoint"
	"github.com/openkubelet/devmgr/podstate"
	"github.com/openkubelet/devmgr/topology"
)

// Allocate gives container the devices its limits ask for, for every
// device-plugin resource, and records the plugin's answer. Admission is all
// or nothing: when one resource fails, what this call reserved or recorded for
// the container is released before Allocate returns. On success the
// checkpoint is on disk before Allocate returns.
//
// Regular init containers hand their devices to the pod's later containers
// (the reuse pool); sidecars and app containers get devices of their own.
// Callers admit a pod's containers in order, init containers first.
//
// Extended resources that no plugin registered and that hold no allocation
// are ignored (administrators advertise such resources by hand), unless
// Options.RequirePlugin names them.
func (m *ManagerImpl) Allocate(ctx context.Context, pod *v1.Pod, container *v1.Container) error {
	if err := checkRequest(pod, container); err != nil {
		return err
	}
	podUID := string(pod.UID)
	m.mu.Lock()
	if m.state == stopped {
		m.mu.Unlock()
		return ErrStopped
	}
	m.inflight[podUID]++
	if m.reuse[podUID] == nil {
		m.reuse[podUID] = map[string]sets.Set[string]{}
	}
	// The reuse pool only serves the pod being admitted; drop other pods'.
	for uid := range m.reuse {
		if uid != podUID && m.inflight[uid] == 0 {
			delete(m.reuse, uid)
		}
	}
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		if m.inflight[podUID]--; m.inflight[podUID] <= 0 {
			delete(m.inflight, podUID)
		}
		m.mu.Unlock()
	}()

	if err := m.allocateContainerResources(ctx, pod, container); err != nil {
		return err
	}
	isInit, restartable := initContainerKind(pod, container.Name)
	m.mu.Lock()
	defer m.mu.Unlock()
	pool := m.reuse[podUID]
	if isInit && !restartable {
		m.ledger.AddContainerDevices(podUID, container.Name, pool)
	} else {
		m.ledger.RemoveContainerDevices(podUID, container.Name, pool)
	}
	return nil
}

// checkRequest refuses what the manager cannot record: no pod or container,
// or a pod UID or container name that is not UTF-8 (JSON, hence the
// checkpoint, cannot carry it: the file would not verify on the next start).
func checkRequest(pod *v1.Pod, container *v1.Container) error {
	switch {
	case pod == nil || container == nil:
		return &admissionError{msg: "pod and container must not be nil", sentinel: ErrInvalidRequest}
	case !utf8.ValidString(string(pod.UID)) || !utf8.ValidString(container.Name):
		return &admissionError{
			msg:      fmt.Sprintf("pod UID %q and container name %q must be valid UTF-8", pod.UID, container.Name),
			sentinel: ErrInvalidRequest,
		}
	}
	return nil
}

// initContainerKind reports whether name is an init container of pod, and
// whether it is restartable (a sidecar).
func initContainerKind(pod *v1.Pod, name string) (isInit, restartable bool) {
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if c.Name == name {
			return true, c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
		}
	}
	return false, false
}

// isDRABacked reports whether the pod's resource claim status maps the
// container's resource to a DRA claim, in which case the device manager must
// not allocate it.
func isDRABacked(pod *v1.Pod, container, resource string) bool {
	st := pod.Status.ExtendedResourceClaimStatus
	if st == nil {
		return false
	}
	for _, rm := range st.RequestMappings {
		if rm.ContainerName == container && rm.ResourceName == resource {
			return true
		}
	}
	return false
}

// allocated is a reservation whose plugin call succeeded, waiting for the
// container's other resources before it becomes a record.
type allocated struct {
	rid      podstate.ReservationID
	resource string
	ids      []string
	resp     *pluginapi.ContainerAllocateResponse
}

// allocateContainerResources allocates every device-plugin resource of the
// container, resource by resource in name order, then records them together.
func (m *ManagerImpl) allocateContainerResources(ctx context.Context, pod *v1.Pod, container *v1.Container) error {
	podUID := string(pod.UID)
	log := m.containerLogger(ctx, pod, container)

	var done []allocated
	release := func() {
		m.mu.Lock()
		for _, a := range done {
			m.ledger.Rollback(a.rid)
			m.inflightDoneLocked(a.rid)
		}
		m.mu.Unlock()
	}
	names := pluginResourceNames(pod, container)
	if _, err := m.awaitPlugins(ctx, log, podUID, container, names); err != nil {
		return err
	}
	collected := false
	for _, name := range names {
		q := container.Resources.Limits[v1.ResourceName(name)]
		m.mu.Lock()
		// A resource only a connected plugin announced is a device-plugin
		// resource too: its devices are on their way.
		isPlugin := m.isDevicePluginResourceLocked(name) || m.notReadyReasonLocked(name) != ""
		m.mu.Unlock()
		if !isPlugin {
			if m.opts.requiresPlugin(name) {
				release()
				return &admissionError{msg: "cannot allocate unregistered device " + name, sentinel: ErrUnregisteredResource}
			}
			continue
		}
		if !collected {
			m.UpdateAllocatedDevices()
			collected = true
		}
		a, err := m.allocateResource(ctx, log.WithValues(keyResource, name), pod, container.Name, name, int(q.Value()))
		if err != nil {
			release()
			return err
		}
		if a != nil {
			done = append(done, *a)
		}
	}
	if len(done) == 0 {
		return nil
	}

	m.mu.Lock()
	resources := make([]string, 0, len(done))
	for _, a := range done {
		m.inflightDoneLocked(a.rid)
		// A concurrent Allocate of the same container may have recorded
		// this resource first. The container keeps that record and this
		// reservation is given back: a record is never replaced, so the
		// undo below and the events only ever touch this call's records.
		if m.ledger.ContainerDevices(podUID, container.Name, a.resource) != nil {
			m.ledger.Rollback(a.rid)
			continue
		}
		// The record's NUMA map reads the topology of its devices.
		var devs podstate.DeviceInstances
		if r := m.resources[a.resource]; r != nil {
			devs = make(podstate.DeviceInstances, len(a.ids))
			for _, id := range a.ids {
				if d := r.device(id); d != nil {
					devs[id] = d
				}
			}
		}
		if err := m.ledger.Commit(a.rid, devs, a.resp); err != nil {
			// Cannot happen: nothing but this call commits or rolls back its
			// reservations.
			m.log.Error(err, "Failed to record allocation", keyResource, a.resource)
		}
		resources = append(resources, a.resource)
	}
	if len(resources) == 0 {
		m.mu.Unlock()
		return nil
	}
	m.gen++
	gen := m.gen
	m.commitSeq++
	m.lastCommit[podUID] = m.commitSeq
	m.mu.Unlock()

	if err := m.persist(gen); err != nil {
		// Never admitted, so no event: the records go without a trace.
		m.mu.Lock()
		m.ledger.DeleteContainerResources(podUID, container.Name, resources...)
		m.gen++
		m.mu.Unlock()
		return &admissionError{
			msg:      fmt.Sprintf("failed to write checkpoint, allocation of %v undone: %v", resources, err),
			sentinel: ErrCheckpoint, cause: err,
		}
	}
	m.pushAdmitted(podUID, container.Name, resources)
	return nil
}

// containerLogger returns the caller's logger when ctx carries one, else the
// manager's, with the pod and container named.
func (m *ManagerImpl) containerLogger(ctx context.Context, pod *v1.Pod, container *v1.Container) klog.Logger {
	log, err := logr.FromContext(ctx)
	if err != nil {
		log = m.log
	}
	return log.WithValues(keyPod, klog.KObj(pod), keyPodUID, string(pod.UID), keyContainer, container.Name)
}

// pluginResourceNames returns, sorted, the resources container asks for
// that no DRA claim of pod serves.
func pluginResourceNames(pod *v1.Pod, container *v1.Container) []string {
	return slices.DeleteFunc(sortedResourceNames(container.Resources.Limits), func(name string) bool {
		return isDRABacked(pod, container.Name, name)
	})
}

func sortedResourceNames(l v1.ResourceList) []string {
	names := make([]string, 0, len(l))
	for n := range l {
		names = append(names, string(n))
	}
	slices.Sort(names)
	return names
}

// allocateResource picks and reserves the devices one container still needs
// of one resource and asks the plugin to allocate them. It returns nil when
// nothing is to be allocated. The lock is never held across a plugin call;
// the devices are reserved from the moment they are picked.
func (m *ManagerImpl) allocateResource(ctx context.Context, log klog.Logger, pod *v1.Pod, container, name string, required int) (*allocated, error) {
	podUID := string(pod.UID)
	var affinity *topology.BitMask
	if m.opts.AffinityStore != nil {
		affinity = m.opts.AffinityStore.GetAffinity(podUID, container).NUMANodeAffinity
	}

	m.mu.Lock()
	in, ep, err := m.selectionInputLocked(podUID, container, name, required, affinity)
	if err != nil || in.Needed == 0 {
		m.mu.Unlock()
		return nil, err
	}
	var preferred []string
	// The query (sorted ID lists) is built only for plugins that answer it.
	if ep.Options().GetGetPreferredAllocationAvailable() {
		if q, ask := podstate.PreferredQueryFor(in); ask {
			m.mu.Unlock()
			preferred = m.preferredAllocation(ctx, log, name, ep, q)
			m.mu.Lock()
			// The world may have moved while the plugin thought: start
			// over with its answer.
			in, ep, err = m.selectionInputLocked(podUID, container, name, required, affinity)
			if err != nil || in.Needed == 0 {
				m.mu.Unlock()
				return nil, err
			}
		}
	}
	ids, err := podstate.Select(in, preferred)
	if err != nil {
		m.mu.Unlock()
		return nil, err
	}
	rid, err := m.ledger.Reserve(podUID, container, name, ids)
	if err == nil {
		m.inflightRPCs[rid] = time.Now()
	}
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	log.V(3).Info("Allocating devices", keyDeviceIDs, ids)

	start := time.Now()
	resp, err := ep.Allocate(ctx, ids)
	m.metrics.allocDuration.WithLabelValues(name).Observe(time.Since(start).Seconds())
	if err != nil {
		m.metrics.rpcErrors.WithLabelValues(name, methodAllocate).Inc()
	}
	if err == nil && len(resp.GetContainerResponses()) == 0 {
		err = fmt.Errorf("no containers return in allocation response %v", resp)
	}
	if err != nil {
		m.mu.Lock()
		m.ledger.Rollback(rid)
		m.inflightDoneLocked(rid)
		m.mu.Unlock()
		return nil, pluginCallError(fmt.Sprintf("device plugin Allocate rpc for %s failed: ", name), err)
	}
	if n := len(resp.ContainerResponses); n > 1 {
		log.V(2).Info("Device plugin answered Allocate for more containers than asked; using the first", keyCount, n)
	}
	return &allocated{rid: rid, resource: name, ids: ids, resp: resp.ContainerResponses[0]}, nil
}

// selectionInputLocked runs the admission checks for one resource and builds
// the selection input. Needed is 0 when the container needs no new devices.
// Expects m.mu held.
func (m *ManagerImpl) selectionInputLocked(podUID, container, name string, required int,
	affinity *topology.BitMask) (podstate.SelectInput, *endpoint.Endpoint, error) {
	needed, err := m.checkLocked(podUID, container, name, required)
	if err != nil || needed == 0 {
		return podstate.SelectInput{}, nil, err
	}
	r := m.resources[name] // registered, or the check would have failed
	if r.primary == nil {
		return podstate.SelectInput{}, nil, &admissionError{msg: "unknown Device Plugin " + name, sentinel: ErrUnknownPlugin}
	}
	var reusable []string
	if pool := m.reuse[podUID][name]; pool.Len() > 0 {
		reusable = sets.List(pool)
	}
	free := m.freeLocked(r)
	in := podstate.SelectInput{
		Resource: name, Required: required, Needed: needed, Reusable: reusable, Available: free,
	}
	// The tiers may list devices that are not free: the selection skips
	// them. Without an affinity every device is in one tier, in ID order.
	if affinity == nil {
		in.Tiers.NoTopology = r.sortedHealthy()
	} else {
		in.Tiers = m.censusLocked(r).Tiers(affinity, r.sortedHealthy(), free.Has)
	}
	return in, r.primary, nil
}

// checkLocked runs the kubelet's admission checks for one resource and
// returns how many devices the container still needs. A resource that is
// not ready is refused with ErrPluginNotReady rather than for having no
// healthy device. Expects m.mu held.
func (m *ManagerImpl) checkLocked(podUID, container, name string, required int) (int, error) {
	check := podstate.RequestCheck{
		PodUID: podUID, ContainerName: container, Resource: name, Required: required,
		Held:           m.ledger.ContainerDevices(podUID, container, name),
		AlreadyRunning: !m.sourcesReady.AllReady() && m.containerMap.IsRunning(podUID, container, m.running),
	}
	if r := m.resources[name]; r != nil {
		check.Registered = r.registered
		check.Healthy = healthySet{r}
	}
	needed, err := podstate.CheckRequest(check)
	return needed, m.notReadyLocked(name, err)
}

// healthySet presents the devices of r that count as healthy as a set.
type healthySet struct{ r *resourceState }

func (h healthySet) Len() int           { return h.r.healthyLen() }
func (h healthySet) Has(id string) bool { return h.r.isHealthy(id) }

// preferredAllocation asks the plugin which devices it prefers. A failing
// plugin is logged and treated as having no preference: one broken card must
// not fail every pod on the node.
func (m *ManagerImpl) preferredAllocation(ctx context.Context, log klog.Logger, name string, ep *endpoint.Endpoint, q podstate.PreferredQuery) []string {
	start := time.Now()
	resp, err := ep.GetPreferredAllocation(ctx, q.Available, q.MustInclude, q.Size)
	m.metrics.preferred.WithLabelValues(name).Observe(time.Since(start).Seconds())
	if err != nil {
		m.metrics.rpcErrors.WithLabelValues(name, methodGetPreferredAllocation).Inc()
		log.Error(err, "Device plugin GetPreferredAllocation failed; allocating without its preference")
		return nil
	}
	if rs := resp.GetContainerResponses(); len(rs) > 0 {
		return rs[0].GetDeviceIDs()
	}
	return nil
}

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
	m.mu.Lock()
	activePods := m.activePods
	m.mu.Unlock()
	var active *bool
	isActive := func() bool {
		if active == nil {
			found := slices.ContainsFunc(activePods(), func(p *v1.Pod) bool { return p.UID == pod.UID })
			active = &found
		}
		return *active
	}

	needsAllocation := false
	for _, name := range sortedResourceNames(container.Resources.Limits) {
		if q := container.Resources.Limits[v1.ResourceName(name)]; q.IsZero() {
			continue
		}
		m.mu.Lock()
		isPlugin := m.isDevicePluginResourceLocked(name)
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
		held := m.ledger.ContainerDevices(podUID, container.Name, name)
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
	opts, conflicts := m.ledger.RunOptions(podUID, container.Name)
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
	r := m.resources[name]
	if r == nil || r.primary == nil {
		m.mu.Unlock()
		return &admissionError{msg: "endpoint not found in cache for a registered resource: " + name, sentinel: ErrUnknownPlugin}
	}
	ep := r.primary
	if !ep.Options().GetPreStartRequired() {
		m.mu.Unlock()
		return nil
	}
	held := m.ledger.ContainerDevices(podUID, container, name)
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
