package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podadmit"
)

// demoConfig configures runDemo.
type demoConfig struct {
	pods   fs.FS       // pod manifests (*.yaml)
	logger klog.Logger // the manager's and plugins' logger
	// tempDir is where the demo's directory is created; "" means
	// os.TempDir(), that is $TMPDIR.
	tempDir string
}

// demoEnv owns what the demo starts: its directory, the current manager and
// the current plugins. close stops them all and removes the directory.
type demoEnv struct {
	dir      string
	log      klog.Logger
	mgr      *devicemanager.ManagerImpl
	admitter *podadmit.Admitter
	specs    []demoPluginSpec
	plugins  []*plugintest.Plugin // current instances, in specs order
	stale    []*plugintest.Plugin // instances replaced by a restart
}

// runDemo runs the whole demo and returns what it saw. Everything it starts
// is stopped, and its directory removed, before it returns, also on error.
func runDemo(ctx context.Context, cfg demoConfig) (rep *demoReport, err error) {
	pods, err := loadDemoPods(cfg.pods)
	if err != nil {
		return nil, err
	}
	// Short name: unix socket paths must fit in 108 bytes.
	dir, err := os.MkdirTemp(cfg.tempDir, "dmdemo")
	if err != nil {
		return nil, err
	}
	env := &demoEnv{dir: dir, log: cfg.logger, specs: demoPluginSpecs()}
	rep = &demoReport{Dir: dir, Steps: demoSteps, NUMANodes: demoNUMANodes}
	defer func() {
		cerr := env.close()
		err = errors.Join(err, cerr)
		rep.Summary.CleanedUp = cerr == nil
	}()
	if err := env.run(ctx, rep, pods); err != nil {
		return rep, err
	}
	return rep, nil
}

func (e *demoEnv) run(ctx context.Context, rep *demoReport, pods []demoPodFile) error {
	// Step 1: the manager. Its active pods are the admitter's.
	if err := e.startManager(ctx, nil); err != nil {
		return err
	}

	// Step 2: the plugins register; capacity.
	for _, spec := range e.specs {
		if _, err := e.startPlugin(ctx, spec, spec.devices); err != nil {
			return err
		}
	}
	if err := e.waitForPlugins(ctx); err != nil {
		return err
	}
	rep.Plugins = e.pluginReport()
	rep.Capacity = demoResources(e.mgr.Status())

	// Steps 3 and 4: admission, devices and run options.
	podByUID := map[string]*v1.Pod{}
	for _, pf := range pods {
		rep.Pods = append(rep.Pods, e.admit(ctx, pf))
		podByUID[string(pf.pod.UID)] = pf.pod
	}
	for i, p := range e.plugins {
		rep.Plugins[i].PreStartCalls = len(p.CallsOf(plugintest.MethodPreStartContainer))
	}

	// Step 5: a device turns unhealthy.
	h, err := e.makeUnhealthy(ctx, rep.Pods, podByUID)
	if err != nil {
		return err
	}
	rep.Health = h

	// Step 6: restart.
	r, err := e.restart(ctx, podByUID)
	if err != nil {
		return err
	}
	rep.Restart = r

	// Step 7: summary.
	rep.Summary = e.summary(rep)
	return nil
}

func (e *demoEnv) socket() string { return filepath.Join(e.dir, devicemanager.KubeletSocketName) }

// startManager starts a manager on the demo directory, and an admitter
// over it that takes back the pods admitted before a restart.
func (e *demoEnv) startManager(ctx context.Context, admitted []*v1.Pod) error {
	mgr, err := devicemanager.NewManagerImpl(devicemanager.Options{
		SocketDir:   e.dir,
		NUMANodes:   demoNUMANodes,
		CallTimeout: 5 * time.Second,
		DialTimeout: 5 * time.Second,
		Logger:      e.log, // the manager names itself "devicemanager"
	})
	if err != nil {
		return err
	}
	adm := podadmit.New(mgr)
	// The manager must not collect the devices of the pods admitted before
	// the restart until they are back.
	var restored atomic.Bool
	if err := mgr.Start(adm.ActivePods, readyFunc(restored.Load), nil, nil); err != nil {
		_ = mgr.Stop()
		return fmt.Errorf("start the device manager: %w", err)
	}
	if err := adm.Restore(ctx, admitted); err != nil {
		_ = mgr.Stop()
		return fmt.Errorf("take the admitted pods back: %w", err)
	}
	restored.Store(true)
	e.mgr, e.admitter = mgr, adm
	return nil
}

// startPlugin starts one fake plugin serving devices and registers it.
func (e *demoEnv) startPlugin(ctx context.Context, spec demoPluginSpec, devices []*pluginapi.Device) (*plugintest.Plugin, error) {
	opts := plugintest.Options{
		ResourceName:                    spec.resource,
		SocketDir:                       e.dir,
		Devices:                         devices,
		PreStartRequired:                spec.preStart,
		GetPreferredAllocationAvailable: spec.policy != "",
		Logger:                          e.log.WithName("plugin").WithValues("resourceName", spec.resource),
	}
	if spec.cdi {
		resource := spec.resource
		opts.CDIDeviceName = func(id string) string { return resource + "=" + id }
	}
	p, err := plugintest.New(opts)
	if err != nil {
		return nil, err
	}
	e.plugins = append(e.plugins, p) // close stops it, whatever happens next
	if spec.policy != "" {
		p.SetPreferredAllocationFunc(packOnOneNUMANode(devices))
	}
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("start the %s plugin: %w", spec.resource, err)
	}
	rctx, cancel := context.WithTimeout(ctx, plugintest.RegisterTimeout)
	defer cancel()
	if err := p.RegisterWith(rctx, e.socket(), p.RegisterRequest()); err != nil {
		return nil, err
	}
	return p, nil
}

// waitForPlugins waits until every plugin's devices are in the manager,
// reported by a live plugin.
func (e *demoEnv) waitForPlugins(ctx context.Context) error {
	want := map[string]int{}
	for _, spec := range e.specs {
		want[spec.resource] = len(spec.devices)
	}
	ready := func() bool {
		seen := 0
		for _, rs := range e.mgr.Status() {
			n, ok := want[rs.Name]
			if !ok {
				continue
			}
			live := slices.ContainsFunc(rs.Endpoints, func(ep devicemanager.EndpointStatus) bool { return !ep.Stopped })
			if rs.RestoredFromCheckpoint || !live || rs.Capacity != n {
				return false
			}
			seen++
		}
		return seen == len(want)
	}
	return demoWaitFor(ctx, "the device plugins to register", ready)
}

// demoWaitFor polls cond until it holds or ctx ends. The manager has no event
// for "a plugin's devices arrived", so a short poll is the way to wait.
func demoWaitFor(ctx context.Context, what string, cond func() bool) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		case <-tick.C:
		}
	}
	return nil
}

func (e *demoEnv) pluginReport() []demoPlugin {
	eps := map[string]devicemanager.EndpointStatus{}
	for _, rs := range e.mgr.Status() {
		for _, ep := range rs.Endpoints {
			if !ep.Stopped {
				eps[rs.Name] = ep
			}
		}
	}
	out := make([]demoPlugin, 0, len(e.specs))
	for _, spec := range e.specs {
		ep := eps[spec.resource]
		out = append(out, demoPlugin{
			Resource:                        spec.resource,
			Socket:                          filepath.Base(ep.Socket),
			Devices:                         len(spec.devices),
			PreStartRequired:                ep.PreStartRequired,
			GetPreferredAllocationAvailable: ep.GetPreferredAllocationAvailable,
			PreferredAllocationPolicy:       spec.policy,
			CDI:                             spec.cdi,
		})
	}
	return out
}

// admit admits one pod through the admitter and reports what each container got,
// or why the pod was refused.
func (e *demoEnv) admit(ctx context.Context, pf demoPodFile) demoPod {
	p := demoPod{
		File: pf.file, Name: pf.pod.Name, Namespace: pf.pod.Namespace, UID: string(pf.pod.UID),
		Containers: []demoContainer{},
	}
	a, err := e.admitter.Admit(ctx, pf.pod)
	if err != nil {
		p.Error = err.Error()
		return p
	}
	p.Admitted, p.UID, p.Namespace = true, string(a.UID), a.Namespace
	for _, c := range a.Containers {
		devs := c.Devices
		if devs == nil {
			devs = map[string][]string{}
		}
		p.Containers = append(p.Containers, demoContainer{
			Name:       c.Name,
			Kind:       demoContainerKind(pf.pod, c.Name),
			Devices:    devs,
			RunOptions: newDemoRunOptions(c.RunOptions),
		})
	}
	return p
}

// makeUnhealthy has the GPU plugin report one allocated GPU unhealthy (the
// last GPU of the first app container holding GPUs), waits for the
// manager to name its pod on Updates(), and reads the health of every device
// allocated to the notified pods' containers.
func (e *demoEnv) makeUnhealthy(ctx context.Context, pods []demoPod, podByUID map[string]*v1.Pod) (*demoHealth, error) {
	var target, owner string
	for _, p := range pods {
		for _, c := range p.Containers {
			if ids := c.Devices[demoGPU]; c.Kind == demoKindApp && len(ids) > 0 && target == "" {
				target, owner = ids[len(ids)-1], p.UID
			}
		}
	}
	if target == "" {
		return nil, errors.New("no pod holds a GPU: nothing to turn unhealthy")
	}
	gpu := e.plugins[slices.IndexFunc(e.specs, func(s demoPluginSpec) bool { return s.resource == demoGPU })]
	devs := gpu.Devices()
	for _, d := range devs {
		if d.GetID() == target {
			d.Health = pluginapi.Unhealthy
		}
	}
	gpu.Update(devs)

	// The manager names the pods whose allocated devices changed health.
	notified := sets.New[string]()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for !notified.Has(owner) {
		select {
		case u, ok := <-e.mgr.Updates():
			if !ok {
				return nil, errors.New("the manager's Updates channel closed")
			}
			notified.Insert(u.PodUIDs...)
		case <-wctx.Done():
			return nil, fmt.Errorf("waiting for the manager to notify pod %s: %w", owner, context.Cause(wctx))
		}
	}

	h := &demoHealth{Resource: demoGPU, Device: target, Containers: []demoDeviceHealth{}}
	for _, uid := range sets.List(notified) {
		pod := podByUID[uid]
		if pod == nil {
			continue
		}
		h.NotifiedPods = append(h.NotifiedPods, pod.Name)
		h.NotifiedPodUIDs = append(h.NotifiedPodUIDs, uid)
		// The kubelet reports device health in the status of regular
		// containers.
		status := &v1.PodStatus{}
		for _, c := range pod.Spec.Containers {
			status.ContainerStatuses = append(status.ContainerStatuses, v1.ContainerStatus{Name: c.Name})
		}
		e.mgr.UpdateAllocatedResourcesStatus(pod, status)
		for _, cs := range status.ContainerStatuses {
			for _, rs := range cs.AllocatedResourcesStatus {
				for _, rh := range rs.Resources {
					h.Containers = append(h.Containers, demoDeviceHealth{
						Pod: pod.Name, Container: cs.Name, Resource: string(rs.Name),
						Device: string(rh.ResourceID), Health: string(rh.Health),
					})
				}
			}
		}
	}
	h.Capacity = demoResources(e.mgr.Status())
	return h, nil
}

// demoAlloc names one allocation: the devices of one resource held by one
// container.
type demoAlloc struct{ podUID, podName, container, resource string }

// allocations lists the allocations of the admitted pods, in admission
// order, init containers first, resources sorted, with the devices the
// manager holds for each.
func (e *demoEnv) allocations() ([]demoAlloc, map[demoAlloc][]string) {
	var out []demoAlloc
	devs := map[demoAlloc][]string{}
	for _, a := range e.admitter.Pods() {
		for _, c := range a.Containers {
			held := e.mgr.GetDevices(string(a.UID), c.Name)
			for _, res := range slices.Sorted(maps.Keys(c.Devices)) {
				k := demoAlloc{podUID: string(a.UID), podName: a.Name, container: c.Name, resource: res}
				out = append(out, k)
				devs[k] = sets.List(sets.KeySet(held[res]))
			}
		}
	}
	return out, devs
}

func demoContainerSpec(pod *v1.Pod, name string) *v1.Container {
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}

// restart stops the manager, starts a new one on the same directory, shows
// what it restored from the checkpoint alone, restarts the plugins (the new
// manager removed their sockets, as the kubelet does) and compares every
// allocation and every container's run options with what they were.
func (e *demoEnv) restart(ctx context.Context, podByUID map[string]*v1.Pod) (*demoRestart, error) {
	allocs, before := e.allocations()
	admitted := e.admitter.AdmittedPods()
	beforeOpts := map[string]*devicemanager.DeviceRunContainerOptions{}
	for _, a := range e.admitter.Pods() {
		for _, c := range a.Containers {
			beforeOpts[string(a.UID)+"/"+c.Name] = c.RunOptions
		}
	}

	_ = e.mgr.Stop()
	r := &demoRestart{}
	file := filepath.Join(e.dir, checkpoint.DeviceManagerKey)
	cp, err := readCheckpointFile(file)
	if err != nil {
		return nil, err
	}
	r.Checkpoint = demoCheckpointInfo{
		File: file, Format: cp.Format, Checksum: cp.checksum, ChecksumOK: cp.ChecksumOK, Entries: len(cp.Entries),
	}

	if err := e.startManager(ctx, admitted); err != nil {
		return nil, err
	}
	r.PluginSocketsRemoved = true
	for _, p := range e.plugins {
		if _, err := os.Stat(p.SocketPath()); !errors.Is(err, os.ErrNotExist) {
			r.PluginSocketsRemoved = false
		}
	}
	_, restored := e.allocations()
	for k, ids := range before {
		if slices.Equal(restored[k], ids) {
			r.RestoredBeforePlugins++
		}
	}
	r.CapacityBeforePlugins = demoResources(e.mgr.Status())

	// The plugins notice kubelet.sock was re-created and restart, keeping
	// their devices' current health.
	old := e.plugins
	e.plugins = nil
	for i, p := range old {
		devices := p.Devices()
		p.Stop()
		e.stale = append(e.stale, p)
		if _, err := e.startPlugin(ctx, e.specs[i], devices); err != nil {
			return nil, err
		}
	}
	if err := e.waitForPlugins(ctx); err != nil {
		return nil, err
	}
	r.PluginsRegistered = true

	_, after := e.allocations()
	r.AllSame, r.RunOptionsSame = true, true
	for _, k := range allocs {
		item := demoRestoredItem{
			Pod: k.podName, Container: k.container, Resource: k.resource,
			Before: before[k], After: after[k], Same: slices.Equal(before[k], after[k]),
		}
		r.AllSame = r.AllSame && item.Same
		r.Allocations = append(r.Allocations, item)
	}
	for _, a := range e.admitter.Pods() {
		pod := podByUID[string(a.UID)]
		for _, c := range a.Containers {
			opts, err := e.mgr.GetDeviceRunContainerOptions(ctx, pod, demoContainerSpec(pod, c.Name))
			if err != nil {
				return nil, fmt.Errorf("run options of %s/%s after the restart: %w", pod.Name, c.Name, err)
			}
			if !reflect.DeepEqual(opts, beforeOpts[string(a.UID)+"/"+c.Name]) {
				r.RunOptionsSame = false
			}
		}
	}
	r.AllSame = r.AllSame && r.RunOptionsSame
	return r, nil
}

func (e *demoEnv) summary(rep *demoReport) demoSummary {
	s := demoSummary{Admitted: []string{}, Refused: []string{}, Allocated: []demoAllocCount{}, NotifiedPods: []string{}}
	for _, p := range rep.Pods {
		if p.Admitted {
			s.Admitted = append(s.Admitted, p.Name)
		} else {
			s.Refused = append(s.Refused, p.Name)
		}
	}
	for _, rs := range e.mgr.Status() {
		s.Allocated = append(s.Allocated, demoAllocCount{Resource: rs.Name, Allocated: rs.Allocated, Capacity: rs.Capacity})
	}
	if rep.Health != nil {
		s.UnhealthyDevice = rep.Health.Device
		s.NotifiedPods = append(s.NotifiedPods, rep.Health.NotifiedPods...)
	}
	if rep.Restart != nil {
		s.Allocations = len(rep.Restart.Allocations)
		for _, a := range rep.Restart.Allocations {
			if a.Same {
				s.Restored++
			}
		}
		s.RunOptionsSame = rep.Restart.RunOptionsSame
	}
	return s
}

// close stops the manager and every plugin and removes the directory.
func (e *demoEnv) close() error {
	if e.mgr != nil {
		_ = e.mgr.Stop()
	}
	for _, p := range slices.Concat(e.plugins, e.stale) {
		p.Stop()
	}
	return os.RemoveAll(e.dir)
}
