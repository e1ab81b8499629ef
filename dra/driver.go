package dra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/openkubelet/devmgr/devicemanager"
)

// CDIClass is the CDI class of the devices a Driver writes; their kind is
// DRIVER/claim.
const CDIClass = "claim"

// DefaultCDIDir is where a Driver writes CDI specs by default: the
// directory for generated specs that containerd and CRI-O read.
const DefaultCDIDir = "/var/run/cdi"

// Manager is what a Driver needs of a device manager.
type Manager interface {
	Source
	PrepareClaim(ctx context.Context, claim devicemanager.Claim, request, resource string, ids []string) (*devicemanager.DeviceRunContainerOptions, error)
	UnprepareClaim(claimUID string) error
	PreparedClaims() []string
	GetDevices(podUID, container string) devicemanager.ResourceDeviceInstances
}

// DriverOptions configure a Driver.
type DriverOptions struct {
	// Manager holds the devices; Client fetches the claims to prepare;
	// NodeName is the node of the pools (as SlicePublisher's).
	Manager  Manager
	Client   kubernetes.Interface
	NodeName string
	// DriverName is the DRA driver's name; default DefaultDriverName.
	DriverName string
	// RegistryDir is the kubelet's plugins registry, where the driver's
	// registration socket goes; default kubeletplugin.KubeletRegistryDir.
	// Created if missing.
	RegistryDir string
	// PluginDir holds the socket the kubelet calls (dra.sock); default
	// kubeletplugin.KubeletPluginsDir/DRIVER. Created if missing.
	PluginDir string
	// CDIDir is where the CDI specs of prepared claims are written;
	// default DefaultCDIDir. Created if missing.
	CDIDir string
	// SweepInterval is how often prepared claims are checked against the
	// API server: a claim that is gone, or no longer allocated, is
	// unprepared (the kubelet lost track of it). Default
	// DefaultSweepInterval.
	SweepInterval time.Duration
	// Clock default: the real clock.
	Clock  clock.WithTicker
	Logger klog.Logger
}

// DefaultSweepInterval is how often a Driver checks its prepared claims
// against the API server by default.
const DefaultSweepInterval = time.Minute

// Driver is the node side of the DRA driver: the kubelet calls it, through
// the plugins registry, to prepare the claims the scheduler allocated from
// the pools of a SlicePublisher with the same driver and node names.
//
// Preparing a claim gives each request's devices to the claim in the
// manager (devicemanager.ManagerImpl.PrepareClaim: the plugin's Allocate,
// then PreStartContainer when the plugin asks for it) and returns, for each
// request, a CDI device that devmgr writes in CDIDir, one spec file per
// claim, holding the environment, mounts and device nodes the plugin
// returned, and the plugin's own CDI devices (in its answer's CDI field or
// its cdi.k8s.io annotations); its other annotations have no place in CDI
// and are dropped. The scheduler has already chosen the devices, so
// GetPreferredAllocation is not called. A claim is prepared all or nothing,
// and a claim whose allocation asks for admin access is refused. Every
// SweepInterval, claims the API server no longer has allocated are
// unprepared.
//
// The manager's checkpoint keeps prepared claims and the spec files stay on
// disk: after a restart of devmgr or the kubelet, preparing a claim again
// returns what the first call did without calling the plugin, and
// unpreparing one prepared before the restart releases it.
type Driver struct {
	opts   DriverOptions
	cdi    *cdi.Cache
	helper *kubeletplugin.Helper
	// cancel ends the sweep; swept is closed when it has.
	cancel context.CancelFunc
	swept  chan struct{}
}

// StartDriver starts serving the kubelet's DRA calls and registers with the
// kubelet's plugins registry. Stop ends it.
func StartDriver(ctx context.Context, opts DriverOptions) (*Driver, error) {
	if err := checkCommon(opts.Manager == nil, opts.Client, opts.NodeName, &opts.DriverName); err != nil {
		return nil, err
	}
	if opts.SweepInterval <= 0 {
		opts.SweepInterval = DefaultSweepInterval
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.RegistryDir == "" {
		opts.RegistryDir = kubeletplugin.KubeletRegistryDir
	}
	if opts.PluginDir == "" {
		opts.PluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, opts.DriverName)
	}
	if opts.CDIDir == "" {
		opts.CDIDir = DefaultCDIDir
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = klog.Background()
	}
	for _, dir := range []string{opts.RegistryDir, opts.PluginDir, opts.CDIDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("dra: %w", err)
		}
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(opts.CDIDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("dra: CDI spec directory: %w", err)
	}
	d := &Driver{opts: opts, cdi: cache}
	d.helper, err = kubeletplugin.Start(klog.NewContext(ctx, opts.Logger), d,
		kubeletplugin.DriverName(opts.DriverName),
		kubeletplugin.KubeClient(opts.Client),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.RegistrarDirectoryPath(opts.RegistryDir),
		kubeletplugin.PluginDataDirectoryPath(opts.PluginDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return nil, fmt.Errorf("dra: start the kubelet plugin: %w", err)
	}
	ctx, d.cancel = context.WithCancel(ctx)
	d.swept = make(chan struct{})
	go d.sweepEvery(ctx)
	return d, nil
}

// Stop stops serving and removes the sockets; prepared claims stay.
func (d *Driver) Stop() {
	d.cancel()
	<-d.swept
	d.helper.Stop()
}

// sweepEvery sweeps every SweepInterval until ctx ends.
func (d *Driver) sweepEvery(ctx context.Context) {
	defer close(d.swept)
	tick := d.opts.Clock.NewTicker(d.opts.SweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
			d.sweep(ctx)
		}
	}
}

// sweep unprepares the prepared claims that the API server no longer has
// allocated: the kubelet unprepares a claim when its pod goes, but one that
// lost its own record of it never will.
func (d *Driver) sweep(ctx context.Context) {
	held := d.opts.Manager.PreparedClaims()
	if len(held) == 0 {
		return
	}
	list, err := d.opts.Client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		d.opts.Logger.Error(err, "Listing ResourceClaims to check the prepared ones; trying again later")
		return
	}
	live := map[types.UID]bool{}
	for _, c := range list.Items {
		if c.Status.Allocation != nil {
			live[c.UID] = true
		}
	}
	for _, uid := range held {
		if live[types.UID(uid)] {
			continue
		}
		res, _ := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: types.UID(uid)}})
		if err := res[types.UID(uid)]; err != nil {
			d.opts.Logger.Error(err, "Unpreparing a claim that is no longer allocated; trying again later", "claimUID", uid)
			continue
		}
		d.opts.Logger.Info("Unprepared a claim that is no longer allocated", "claimUID", uid)
	}
}

// SocketPath is the path of the socket the kubelet calls.
func (d *Driver) SocketPath() string { return filepath.Join(d.opts.PluginDir, "dra.sock") }

// CDIDeviceName returns the CDI device of a claim's request.
func (d *Driver) CDIDeviceName(claimUID types.UID, request string) string {
	return parser.QualifiedName(d.opts.DriverName, CDIClass, cdiName(claimUID, request))
}

// cdiName is the unqualified CDI name of a claim's request: unique on the
// node, as the claim's UID is, and never reused.
func cdiName(claimUID types.UID, request string) string {
	return string(claimUID) + "-" + strings.ReplaceAll(request, "/", "_")
}

// specName is the file name of a claim's CDI spec.
func (d *Driver) specName(claimUID types.UID) string {
	return cdi.GenerateTransientSpecName(d.opts.DriverName, CDIClass, string(claimUID)) + ".json"
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	where := d.deviceIndex()
	prepared := d.opts.Manager.PreparedClaims()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		res, err := d.prepare(ctx, c, where)
		if err != nil {
			// All or nothing: what this call gave the claim goes back. A
			// claim prepared before keeps its devices: its containers may
			// be running.
			if _, before := slices.BinarySearch(prepared, string(c.UID)); !before {
				err = errors.Join(err, d.opts.Manager.UnprepareClaim(string(c.UID)))
			}
			res = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
		}
		out[c.UID] = res
	}
	return out, nil
}

// location is where a published device comes from.
type location struct{ resource, id string }

// deviceIndex maps pool and device names to the manager's devices.
func (d *Driver) deviceIndex() map[string]map[string]location {
	idx := map[string]map[string]location{}
	for _, r := range d.opts.Manager.Status() {
		devs := make(map[string]location, len(r.Devices))
		for _, dev := range r.Devices {
			if _, taken := devs[DeviceName(dev.ID)]; !taken { // as Resources: the first ID of a name
				devs[DeviceName(dev.ID)] = location{resource: r.Name, id: dev.ID}
			}
		}
		idx[PoolName(d.opts.NodeName, r.Name)] = devs
	}
	return idx
}

// heldBy finds the device of r among those the claim's request already
// holds: after a restart, a claim is prepared again before its plugin lists
// its devices.
func (d *Driver) heldBy(claimUID types.UID, r resourceapi.DeviceRequestAllocationResult) (location, bool) {
	for resource, devs := range d.opts.Manager.GetDevices(devicemanager.ClaimPodUID(string(claimUID)), r.Request) {
		if PoolName(d.opts.NodeName, resource) != r.Pool {
			continue
		}
		for id := range devs {
			if DeviceName(id) == r.Device {
				return location{resource: resource, id: id}, true
			}
		}
	}
	return location{}, false
}

// prepare prepares one claim: each request's devices, then the claim's CDI
// spec.
func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim, where map[string]map[string]location) (kubeletplugin.PrepareResult, error) {
	var res kubeletplugin.PrepareResult
	if c.Status.Allocation == nil {
		return res, errors.New("not allocated")
	}
	type key struct{ request, resource string }
	ids := map[key][]string{}
	var order []key
	firstOf := map[string]int{} // request -> index in res.Devices of its first device
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.opts.DriverName {
			continue
		}
		if r.AdminAccess != nil && *r.AdminAccess {
			return res, fmt.Errorf("request %s asks for admin access to %s, which a device plugin's devices cannot give: a device is one claim's or one pod's", r.Request, r.Device)
		}
		loc, ok := where[r.Pool][r.Device]
		if !ok {
			loc, ok = d.heldBy(c.UID, r)
		}
		if !ok {
			return res, fmt.Errorf("device %s of pool %s is not a device of this node's plugins (or its plugin has not listed its devices since devmgr started)", r.Device, r.Pool)
		}
		k := key{r.Request, loc.resource}
		if _, seen := ids[k]; !seen {
			order = append(order, k)
		}
		ids[k] = append(ids[k], loc.id)
		if _, seen := firstOf[r.Request]; !seen {
			firstOf[r.Request] = len(res.Devices)
		}
		res.Devices = append(res.Devices, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
	}
	claim := devicemanager.Claim{Namespace: c.Namespace, Name: c.Name, UID: string(c.UID)}
	edits := map[string]*devicemanager.DeviceRunContainerOptions{} // by request
	for _, k := range order {
		opts, err := d.opts.Manager.PrepareClaim(ctx, claim, k.request, k.resource, ids[k])
		if err != nil {
			return res, err
		}
		edits[k.request] = opts // the request's options, over all its resources
	}
	spec := &cdispec.Spec{Kind: d.opts.DriverName + "/" + CDIClass}
	for _, request := range slices.Sorted(maps.Keys(edits)) {
		opts := edits[request]
		var cdiIDs []string
		if e := containerEdits(opts); e != nil {
			spec.Devices = append(spec.Devices, cdispec.Device{Name: cdiName(c.UID, request), ContainerEdits: *e})
			cdiIDs = append(cdiIDs, d.CDIDeviceName(c.UID, request))
		}
		for _, dev := range opts.CDIDevices {
			cdiIDs = append(cdiIDs, dev.Name)
		}
		named, err := d.annotatedDevices(c, request, opts.Annotations)
		if err != nil {
			return res, err
		}
		cdiIDs = append(cdiIDs, named...)
		res.Devices[firstOf[request]].CDIDeviceIDs = cdiIDs
	}
	if len(spec.Devices) == 0 {
		return res, nil
	}
	var err error
	if spec.Version, err = cdispec.MinimumRequiredVersion(spec); err != nil {
		return res, err
	}
	if err := d.cdi.WriteSpec(spec, d.specName(c.UID)); err != nil {
		return res, fmt.Errorf("write its CDI spec: %w", err)
	}
	return res, nil
}

// annotatedDevices returns the CDI devices a plugin named in annotations
// (cdi.k8s.io/...), the way some plugins pass them; the other annotations
// have no place in CDI and are dropped, with a log line.
func (d *Driver) annotatedDevices(c *resourceapi.ResourceClaim, request string, annotations []devicemanager.Annotation) ([]string, error) {
	cdiAnnotations := map[string]string{}
	var dropped []string
	for _, a := range annotations {
		if strings.HasPrefix(a.Name, cdi.AnnotationPrefix) {
			cdiAnnotations[a.Name] = a.Value
		} else {
			dropped = append(dropped, a.Name)
		}
	}
	if len(dropped) > 0 {
		d.opts.Logger.V(2).Info("Dropped the plugin's container annotations: CDI cannot carry them",
			"claim", klog.KObj(c), "request", request, "annotations", dropped)
	}
	_, devices, err := cdi.ParseAnnotations(cdiAnnotations)
	if err != nil {
		return nil, fmt.Errorf("the plugin's CDI annotations: %w", err)
	}
	return devices, nil
}

// containerEdits returns the CDI form of what a plugin's Allocate asked of
// the runtime, nil when it asked nothing CDI can say.
func containerEdits(o *devicemanager.DeviceRunContainerOptions) *cdispec.ContainerEdits {
	if o == nil || len(o.Envs)+len(o.Mounts)+len(o.Devices) == 0 {
		return nil
	}
	e := &cdispec.ContainerEdits{}
	for _, env := range o.Envs {
		e.Env = append(e.Env, env.Name+"="+env.Value)
	}
	for _, dev := range o.Devices {
		e.DeviceNodes = append(e.DeviceNodes, &cdispec.DeviceNode{
			Path: dev.PathInContainer, HostPath: dev.PathOnHost, Permissions: dev.Permissions,
		})
	}
	for _, m := range o.Mounts {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		e.Mounts = append(e.Mounts, &cdispec.Mount{
			HostPath: m.HostPath, ContainerPath: m.ContainerPath, Type: "bind", Options: []string{"rbind", mode},
		})
	}
	return e
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin: the claim's
// spec file goes, then its devices.
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		err := d.cdi.RemoveSpec(d.specName(c.UID))
		if err == nil {
			err = d.opts.Manager.UnprepareClaim(string(c.UID))
		}
		out[c.UID] = err
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin: background errors are
// logged; the helper retries what can be retried.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	d.opts.Logger.Error(err, msg)
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin; the health service
// is off (unhealthy devices leave the pools instead).
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
