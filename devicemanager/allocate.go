package devicemanager

import (
	"context"
	"errors"
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
	"github.com/openkubelet/devmgr/podinfo"
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
	m.core.beginAllocate(podUID)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.core.endCall(podUID)
		m.mu.Unlock()
	}()

	if err := m.allocateContainerResources(ctx, pod, container); err != nil {
		return err
	}
	isInit, restartable := initContainerKind(pod, container.Name)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.core.containerAdmitted(podUID, container.Name, isInit && !restartable)
	return nil
}

// beginAllocate counts an Allocate call of the pod, which gets an
// admission record if it has none. The reuse pool serves only the pod
// being admitted: other pods with no call in progress lose theirs, and
// their record when it holds nothing else.
func (c *core) beginAllocate(podUID string) {
	a := c.beginCall(podUID)
	if a.reuse == nil {
		a.reuse = map[string]sets.Set[string]{}
	}
	for uid, other := range c.pods {
		if uid == podUID || other.calls > 0 {
			continue
		}
		other.reuse = nil
		if other.lastCommit == 0 {
			delete(c.pods, uid)
		}
	}
}

// beginCall counts a call that may record allocations of the pod, which
// gets an admission record if it has none, and returns the record.
func (c *core) beginCall(podUID string) *admission {
	a := c.pods[podUID]
	if a == nil {
		a = &admission{}
		c.pods[podUID] = a
	}
	a.calls++
	return a
}

// endCall ends an Allocate call of the pod, or a beginCall.
func (c *core) endCall(podUID string) {
	if a := c.pods[podUID]; a != nil {
		a.calls--
	}
}

// containerAdmitted updates the pod's reuse pool once a container has its
// devices: a regular init container's devices go into it (handsOver), any
// other container's leave it. Expects an Allocate call of the pod in
// progress.
func (c *core) containerAdmitted(podUID, container string, handsOver bool) {
	pool := c.pods[podUID].reuse
	if handsOver {
		c.ledger.AddContainerDevices(podUID, container, pool)
	} else {
		c.ledger.RemoveContainerDevices(podUID, container, pool)
	}
}

// reusable is the pod's reuse pool of resource; nil if empty.
func (c *core) reusable(podUID, resource string) sets.Set[string] {
	if a := c.pods[podUID]; a != nil {
		return a.reuse[resource]
	}
	return nil
}

// checkRequest refuses what the manager cannot record: no pod or container,
// a pod UID that stands for a claim (ClaimPodUID), or a pod UID or container
// name that is not UTF-8 (JSON, hence the checkpoint, cannot carry it: the
// file would not verify on the next start).
func checkRequest(pod *v1.Pod, container *v1.Container) error {
	switch {
	case pod == nil || container == nil:
		return &admissionError{msg: "pod and container must not be nil", sentinel: ErrInvalidRequest}
	case isClaim(string(pod.UID)):
		return &admissionError{msg: fmt.Sprintf("pod UID %q is reserved for ResourceClaims", pod.UID), sentinel: ErrInvalidRequest}
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
	ctx = m.callContext(ctx, pod, container.Name)

	var done []allocated
	release := func() {
		rids := make([]podstate.ReservationID, len(done))
		for i, a := range done {
			rids[i] = a.rid
		}
		m.mu.Lock()
		m.signal(m.core.rollback(rids...))
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
		isPlugin := m.core.isDevicePluginResource(name) || m.core.notReadyReason(name, m.opts.Clock.Now()) != ""
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
	return m.commit(podUID, container.Name, done)
}

// commit records the allocations of done, whose plugin calls succeeded, as
// the container's records and writes the checkpoint. When the write fails
// the records are undone and an admission error returned.
func (m *ManagerImpl) commit(podUID, container string, done []allocated) error {
	if len(done) == 0 {
		return nil
	}
	m.mu.Lock()
	resources, eff, err := m.core.record(podUID, container, done)
	m.signal(eff)
	m.mu.Unlock()
	if err != nil {
		m.log.Error(err, "Failed to record allocation") // nothing but this call settles its reservations
	}
	if len(resources) == 0 {
		return nil
	}
	if err := m.persist(eff.gen); err != nil {
		// Never admitted, so no event: the records go without a trace.
		m.mu.Lock()
		m.core.undo(podUID, container, resources)
		m.mu.Unlock()
		return &admissionError{
			msg:      fmt.Sprintf("failed to write checkpoint, allocation of %v undone: %v", resources, err),
			sentinel: ErrCheckpoint, cause: err,
		}
	}
	m.mu.Lock()
	m.signal(effects{events: m.core.admittedEvents(podUID, container, resources)})
	m.mu.Unlock()
	return nil
}

// rollback gives back reservations whose admission failed.
func (c *core) rollback(rids ...podstate.ReservationID) effects {
	for _, rid := range rids {
		c.ledger.Rollback(rid)
	}
	return effects{settled: len(rids) > 0}
}

// record turns the reservations of done, whose plugin calls succeeded, into
// the container's records, and returns the resources recorded. A resource
// that a concurrent Allocate of the same container recorded first keeps
// that record, and this call's reservation is given back: a record is never
// replaced, so undo and the events only ever touch this call's records.
// Expects an Allocate call of the pod in progress.
func (c *core) record(podUID, container string, done []allocated) (resources []string, eff effects, err error) {
	eff.settled = true
	var errs []error
	for _, a := range done {
		if c.ledger.ContainerDevices(podUID, container, a.resource) != nil {
			c.ledger.Rollback(a.rid)
			continue
		}
		// The record's NUMA map reads the topology of its devices.
		var devs podstate.DeviceInstances
		if r := c.resources[a.resource]; r != nil {
			devs = make(podstate.DeviceInstances, len(a.ids))
			for _, id := range a.ids {
				if d := r.device(id); d != nil {
					devs[id] = d
				}
			}
		}
		if err := c.ledger.Commit(a.rid, devs, a.resp); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a.resource, err))
			continue
		}
		resources = append(resources, a.resource)
	}
	if len(resources) > 0 {
		eff.merge(c.changed())
		c.commits++
		c.pods[podUID].lastCommit = c.commits
	}
	return resources, eff, errors.Join(errs...)
}

// undo drops the records an admission made, whose checkpoint write failed.
func (c *core) undo(podUID, container string, resources []string) {
	c.ledger.DeleteContainerResources(podUID, container, resources...)
	c.gen++
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

// callContext returns ctx for the plugin calls made for a container: with
// the pod and container named in the metadata when Options.SendPodInfo is
// set.
func (m *ManagerImpl) callContext(ctx context.Context, pod *v1.Pod, container string) context.Context {
	if !m.opts.SendPodInfo {
		return ctx
	}
	return podinfo.NewOutgoingContext(ctx, podinfo.Info{
		Kind: podinfo.KindPod, Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), Container: container,
	})
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
	in, ep, err := m.selectionLocked(podUID, container, name, required, affinity)
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
			in, ep, err = m.selectionLocked(podUID, container, name, required, affinity)
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
	rid, err := m.core.ledger.Reserve(podUID, container, name, ids)
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	log.V(3).Info("Allocating devices", keyDeviceIDs, ids)
	return m.callAllocate(ctx, log, name, ep, rid, ids)
}

// callAllocate asks the plugin to allocate ids, reserved as rid. On failure
// the reservation is rolled back.
func (m *ManagerImpl) callAllocate(ctx context.Context, log klog.Logger, name string, ep *endpoint.Endpoint,
	rid podstate.ReservationID, ids []string) (*allocated, error) {
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
		m.signal(m.core.rollback(rid))
		m.mu.Unlock()
		return nil, pluginCallError(fmt.Sprintf("device plugin Allocate rpc for %s failed: ", name), err)
	}
	if n := len(resp.ContainerResponses); n > 1 {
		log.V(2).Info("Device plugin answered Allocate for more containers than asked; using the first", keyCount, n)
	}
	return &allocated{rid: rid, resource: name, ids: ids, resp: resp.ContainerResponses[0]}, nil
}

// selectionLocked is core.selection with what the manager knows of the
// pods and the time. Expects m.mu held.
func (m *ManagerImpl) selectionLocked(podUID, container, name string, required int,
	affinity *topology.BitMask) (podstate.SelectInput, *endpoint.Endpoint, error) {
	return m.core.selection(podUID, container, name, required, affinity,
		m.podSource.alreadyRunning(podUID, container), m.opts.Clock.Now())
}

// selection runs the admission checks for one resource and builds the
// selection input, with the endpoint to ask. Needed is 0 when the
// container needs no new devices.
func (c *core) selection(podUID, container, name string, required int, affinity *topology.BitMask,
	alreadyRunning bool, now time.Time) (podstate.SelectInput, *endpoint.Endpoint, error) {
	needed, err := c.check(podUID, container, name, required, alreadyRunning, now)
	if err != nil || needed == 0 {
		return podstate.SelectInput{}, nil, err
	}
	r := c.resources[name] // registered, or the check would have failed
	if r.primary == nil {
		return podstate.SelectInput{}, nil, &admissionError{msg: "unknown Device Plugin " + name, sentinel: ErrUnknownPlugin}
	}
	var reusable []string
	if pool := c.reusable(podUID, name); pool.Len() > 0 {
		reusable = sets.List(pool)
	}
	free := c.free(r)
	in := podstate.SelectInput{
		Resource: name, Required: required, Needed: needed, Reusable: reusable, Available: free,
	}
	// The tiers may list devices that are not free: the selection skips
	// them. Without an affinity every device is in one tier, in ID order.
	if affinity == nil {
		in.Tiers.NoTopology = r.sortedHealthy()
	} else {
		in.Tiers = c.census(r).Tiers(affinity, r.sortedHealthy(), free.Has)
	}
	return in, r.primary, nil
}

// check runs the kubelet's admission checks for one resource and returns
// how many devices the container still needs. A resource that is not ready
// is refused with ErrPluginNotReady rather than for having no healthy
// device.
func (c *core) check(podUID, container, name string, required int, alreadyRunning bool, now time.Time) (int, error) {
	check := podstate.RequestCheck{
		PodUID: podUID, ContainerName: container, Resource: name, Required: required,
		Held:           c.ledger.ContainerDevices(podUID, container, name),
		AlreadyRunning: alreadyRunning,
	}
	if r := c.resources[name]; r != nil {
		check.Registered = r.registered
		check.Healthy = healthySet{r}
	}
	needed, err := podstate.CheckRequest(check)
	return needed, c.notReady(name, err, now)
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
