// Package dra makes the device plugins of a devicemanager.ManagerImpl a
// Dynamic Resource Allocation (resource.k8s.io/v1) driver for their node, so
// that an unmodified device plugin can serve ResourceClaims.
//
// SlicePublisher publishes the plugins' devices as ResourceSlices, one pool
// per resource and node, with the resourceslice controller of
// k8s.io/dynamic-resource-allocation: the scheduler then allocates claims
// from them. Driver is the node side the kubelet calls to prepare those
// claims: through the plugins' Allocate, with a CDI spec for the runtime.
//
// # Devices
//
// Each device a plugin lists healthy, and that no device-plugin container
// holds, is one device of its resource's pool (a device a claim holds stays
// in it: the claim's allocation names it). Its name is the plugin's ID
// when that is a DNS label, else a DNS label made from the ID and a hash of
// it; its attributes are the resource name (resourceName), the plugin's ID
// (deviceID) and, for a device on exactly one NUMA node, that node as the
// standard resource.kubernetes.io/numaNode. Unhealthy devices, and devices
// that device-plugin containers hold, are left out rather than tainted:
// device taints need a feature gate that a cluster may not have, and a
// device left out is one the scheduler cannot give to a claim on any
// cluster. A resource whose plugin is gone keeps an empty pool until the
// manager removes the resource (after its grace period); then the pool goes.
//
// # Concurrency and lifecycle
//
// Run publishes until its context ends, reading the manager every
// PollInterval, and then stops the controller. The slices stay behind when
// Run returns; a Node owns them, so they go with it.
package dra

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/openkubelet/devmgr/devicemanager"
)

// DefaultDriverName is the DRA driver name the publisher uses by default.
const DefaultDriverName = "devmgr.openkubelet.io"

// The attributes of a published device, in the driver's domain.
const (
	AttributeResourceName resourceapi.QualifiedName = "resourceName"
	AttributeDeviceID     resourceapi.QualifiedName = "deviceID"
)

// DefaultPollInterval is how often the publisher reads the manager by
// default.
const DefaultPollInterval = time.Second

// Source is what the publisher reads of a manager.
type Source interface {
	Status() []devicemanager.ResourceStatus
}

// SlicePublisherOptions configure a SlicePublisher.
type SlicePublisherOptions struct {
	// Manager is the device manager whose devices are published.
	Manager Source
	// Client reaches the API server; NodeName is the node the devices are
	// on, whose Node owns the slices.
	Client   kubernetes.Interface
	NodeName string
	// DriverName is the DRA driver's name (a DNS subdomain); default
	// DefaultDriverName.
	DriverName string
	// DeviceClasses: make a DeviceClass (DeviceClass) for each resource
	// that has none, so that a pod asking for the resource as an extended
	// resource (example.com/gpu: 1) is served through DRA on a node whose
	// status does not advertise it. Existing classes are left as they are.
	DeviceClasses bool
	// PollInterval is how often the manager is read; default
	// DefaultPollInterval.
	PollInterval time.Duration
	// Clock default: the real clock.
	Clock  clock.WithTicker
	Logger klog.Logger
}

// SlicePublisher keeps a node's ResourceSlices in step with a manager.
type SlicePublisher struct {
	opts SlicePublisherOptions
}

// NewSlicePublisher checks opts and returns a publisher; Run starts it.
func NewSlicePublisher(opts SlicePublisherOptions) (*SlicePublisher, error) {
	if err := checkCommon(opts.Manager == nil, opts.Client, opts.NodeName, &opts.DriverName); err != nil {
		return nil, err
	}
	if opts.PollInterval < 0 {
		return nil, errors.New("dra: negative PollInterval")
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = klog.Background()
	}
	return &SlicePublisher{opts: opts}, nil
}

// checkCommon checks what the publisher and the driver both need: a
// manager, a client, a node, and a driver name (DefaultDriverName when
// empty) that is a DNS subdomain, as ResourceSlices want, and a CDI vendor,
// as the driver's CDI devices want.
func checkCommon(noManager bool, client kubernetes.Interface, node string, driver *string) error {
	switch {
	case noManager:
		return errors.New("dra: no Manager")
	case client == nil:
		return errors.New("dra: no Client")
	case node == "":
		return errors.New("dra: no NodeName")
	}
	if *driver == "" {
		*driver = DefaultDriverName
	}
	if errs := validation.IsDNS1123Subdomain(*driver); len(errs) > 0 {
		return fmt.Errorf("dra: driver name %q: %s", *driver, strings.Join(errs, "; "))
	}
	if err := parser.ValidateVendorName(*driver); err != nil {
		return fmt.Errorf("dra: driver name %q cannot name CDI devices: %w", *driver, err)
	}
	return nil
}

// Run publishes until ctx ends, then returns ctx's error; an error at once
// when the controller cannot start. Failed writes are logged and retried by
// the controller.
func (p *SlicePublisher) Run(ctx context.Context) error {
	log := p.opts.Logger.WithValues("driver", p.opts.DriverName, "node", p.opts.NodeName)
	st := p.opts.Manager.Status()
	want := Resources(p.opts.NodeName, st)
	made := map[string]bool{} // resources whose class exists
	if p.opts.DeviceClasses {
		p.ensureClasses(ctx, log, st, made)
	}
	ctrl, err := resourceslice.StartController(klog.NewContext(ctx, log), resourceslice.Options{
		DriverName: p.opts.DriverName,
		KubeClient: p.opts.Client,
		Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: p.opts.NodeName},
		Resources:  want,
		ErrorHandler: func(_ context.Context, err error, msg string) {
			log.Error(err, "Publishing ResourceSlices: "+msg)
		},
	})
	if err != nil {
		return fmt.Errorf("dra: start the ResourceSlice controller: %w", err)
	}
	defer ctrl.Stop()
	log.Info("Publishing devices as ResourceSlices", "pools", slices.Sorted(maps.Keys(want.Pools)))
	tick := p.opts.Clock.NewTicker(p.opts.PollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C():
		}
		st = p.opts.Manager.Status()
		if p.opts.DeviceClasses {
			p.ensureClasses(ctx, log, st, made)
		}
		next := Resources(p.opts.NodeName, st)
		if !sameResources(want, next) {
			want = next
			ctrl.Update(want)
			log.V(2).Info("Device lists changed; ResourceSlices updated", "pools", slices.Sorted(maps.Keys(want.Pools)))
		}
	}
}

// ensureClasses creates the DeviceClass of each resource of st not in
// made, and adds those that exist to made. Failures are logged and tried
// again on the next call.
func (p *SlicePublisher) ensureClasses(ctx context.Context, log klog.Logger, st []devicemanager.ResourceStatus, made map[string]bool) {
	for _, r := range st {
		if made[r.Name] {
			continue
		}
		class := DeviceClass(p.opts.DriverName, r.Name)
		_, err := p.opts.Client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{FieldManager: "devmgr"})
		switch {
		case err == nil:
			log.Info("Created a DeviceClass for the resource", "deviceClass", class.Name, "resourceName", r.Name)
		case apierrors.IsAlreadyExists(err):
		default:
			log.Error(err, "Creating a DeviceClass", "deviceClass", class.Name, "resourceName", r.Name)
			continue
		}
		made[r.Name] = true
	}
}

// DeviceClass returns the DeviceClass of resource's devices published by
// driver: named DeviceClassName(resource), selecting them by the
// resourceName attribute, with resource as its extended resource name.
func DeviceClass(driver, resource string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: DeviceClassName(resource)},
		Spec: resourceapi.DeviceClassSpec{
			Selectors:            []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: Selector(driver, resource)}}},
			ExtendedResourceName: ptr.To(resource),
		},
	}
}

// Selector is the CEL expression that selects resource's devices published
// by driver.
func Selector(driver, resource string) string {
	return fmt.Sprintf("device.driver == %q && device.attributes[%q].%s == %q", driver, driver, AttributeResourceName, resource)
}

// DeviceClassName returns resource with '/' as '-' when that is a DNS
// subdomain (example.com-gpu), else a DNS label made from resource and its
// hash.
func DeviceClassName(resource string) string {
	name := strings.ReplaceAll(resource, "/", "-")
	if len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	return hashed(resource, validation.DNS1123LabelMaxLength)
}

// sameResources reports whether a and b describe the same pools and
// devices.
func sameResources(a, b *resourceslice.DriverResources) bool {
	return maps.EqualFunc(a.Pools, b.Pools, func(x, y resourceslice.Pool) bool {
		return slices.EqualFunc(x.Slices, y.Slices, func(s, t resourceslice.Slice) bool {
			return resourceslice.DevicesDeepEqual(s.Devices, t.Devices)
		})
	})
}

// Resources returns the pools that describe the devices of st on node: one
// per resource, named PoolName(node, resource), its devices in ID order in
// slices of at most resourceapi.ResourceSliceMaxDevices.
func Resources(node string, st []devicemanager.ResourceStatus) *resourceslice.DriverResources {
	out := &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{}}
	for _, r := range st {
		var devs []resourceapi.Device
		seen := map[string]bool{}
		for _, d := range r.Devices {
			if d.Health != "Healthy" || d.Allocated && !d.Claimed {
				continue
			}
			dev := Device(r.Name, d)
			if seen[dev.Name] {
				continue // two IDs made one name: hash collision, not expected
			}
			seen[dev.Name] = true
			devs = append(devs, dev)
		}
		slices.SortFunc(devs, func(a, b resourceapi.Device) int { return strings.Compare(a.Name, b.Name) })
		pool := resourceslice.Pool{Slices: []resourceslice.Slice{{}}} // an empty pool: the plugin is there
		for chunk := range slices.Chunk(devs, resourceapi.ResourceSliceMaxDevices) {
			if len(pool.Slices[0].Devices) > 0 {
				pool.Slices = append(pool.Slices, resourceslice.Slice{})
			}
			pool.Slices[len(pool.Slices)-1].Devices = chunk
		}
		out.Pools[PoolName(node, r.Name)] = pool
	}
	return out
}

// Device returns the published form of d, a device of resource.
func Device(resource string, d devicemanager.DeviceStatus) resourceapi.Device {
	dev := resourceapi.Device{
		Name: DeviceName(d.ID),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			AttributeResourceName: {StringValue: ptr.To(resource)},
			AttributeDeviceID:     {StringValue: ptr.To(d.ID)},
		},
	}
	if len(d.NUMANodes) == 1 && d.NUMANodes[0] >= 0 {
		dev.Attributes[deviceattribute.StandardDeviceAttributeNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(d.NUMANodes[0])}
	}
	return dev
}

// DeviceName returns id when it is a DNS label, else a DNS label made of
// id's letters and digits (lower case, others as '-') and a hash of id.
func DeviceName(id string) string {
	if len(validation.IsDNS1123Label(id)) == 0 {
		return id
	}
	return hashed(id, validation.DNS1123LabelMaxLength)
}

// PoolName returns the pool of resource on node: "node/resource" when that
// is a valid pool name (DNS subdomains separated by slashes), else
// "node/" followed by a DNS label made from resource and its hash.
func PoolName(node, resource string) string {
	name := node + "/" + resource
	valid := len(name) <= resourceapi.PoolNameMaxLength
	for part := range strings.SplitSeq(name, "/") {
		valid = valid && len(validation.IsDNS1123Subdomain(part)) == 0
	}
	if valid {
		return name
	}
	return node + "/" + hashed(resource, min(validation.DNS1123LabelMaxLength, resourceapi.PoolNameMaxLength-len(node)-1))
}

// hashed returns a DNS label of at most limit bytes: the lower-case letters
// and digits of s (other bytes as '-', runs of them as one), cut to fit,
// then '-' and 8 hex digits of s's FNV-1a hash.
func hashed(s string, limit int) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	suffix := fmt.Sprintf("%08x", h.Sum32())
	var b strings.Builder
	for _, c := range strings.ToLower(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			b.WriteRune(c)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	prefix := strings.Trim(b.String(), "-")
	if room := limit - len(suffix) - 1; len(prefix) > room {
		prefix = strings.TrimRight(prefix[:max(room, 0)], "-")
	}
	if prefix == "" {
		return "d" + suffix
	}
	return prefix + "-" + suffix
}
