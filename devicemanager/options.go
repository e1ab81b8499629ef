package devicemanager

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/clock"

	"github.com/openkubelet/devmgr/endpoint"
	"github.com/openkubelet/devmgr/internal/pluginreg"
	"github.com/openkubelet/devmgr/topology"
)

// DefaultStopGracePeriod is how long a resource whose plugin is gone stays
// visible (with allocatable 0) before GetCapacity removes it: the kubelet's
// five minutes.
const DefaultStopGracePeriod = 5 * time.Minute

// Defaults of the limits on what plugins may send (see Options). Each is far
// above what a real node needs, so that it stops only a plugin that is broken
// or hostile.
const (
	// DefaultMaxDevicesPerResource: the largest plugins list tens of
	// thousands of IDs per card (a GPU shared by time-slicing replicas or
	// advertised in units of its memory), on nodes of up to sixteen cards;
	// a million covers eight cards of 120,000 IDs each, or sixteen of
	// 60,000.
	DefaultMaxDevicesPerResource = 1_000_000
	// DefaultMaxResources: a node serves a handful of resources, a few
	// dozen where SR-IOV pools or MIG profiles each get a name of their
	// own.
	DefaultMaxResources = 1_000
	// DefaultMaxInstancesPerResource: one instance per card where a plugin
	// runs a process per card, twice that while a new version of the plugin
	// starts beside the old one.
	DefaultMaxInstancesPerResource = 100
)

// KubeletSocketName is the name of the registration socket in SocketDir.
const KubeletSocketName = "kubelet.sock"

// Options configure a ManagerImpl. Zero values mean the defaults; further
// options are only ever added as fields whose zero value means "default".
type Options struct {
	// SocketDir holds kubelet.sock and the plugins' sockets; absolute.
	// Default pluginapi.DevicePluginPath (/var/lib/kubelet/device-plugins/).
	SocketDir string
	// CheckpointDir holds kubelet_internal_checkpoint; absolute. Default
	// SocketDir.
	CheckpointDir string
	// NUMANodes are the machine's NUMA node ids (topology.Discover reads them
	// from sysfs). Empty: no topology; hints are then "no preference".
	NUMANodes []int
	// AffinityStore gives the NUMA affinity chosen for each container; nil:
	// no alignment.
	AffinityStore topology.AffinityStore
	// StopGracePeriod: how long a resource outlives its plugin. Default 5m.
	StopGracePeriod time.Duration
	// CallTimeout bounds each Allocate and GetPreferredAllocation call.
	// Default 30s.
	CallTimeout time.Duration
	// PreStartTimeout bounds each PreStartContainer call. Default 30s.
	PreStartTimeout time.Duration
	// DialTimeout bounds the dial-back of a registering plugin. Default 10s.
	DialTimeout time.Duration
	// MaxRecvMsgSize is the largest ListAndWatch message accepted, in bytes.
	// Default 64 MiB (the kubelet: 4 MiB).
	MaxRecvMsgSize int
	// MaxDevicesPerResource is the most devices one ListAndWatch message may
	// list. A longer list is not applied: the instance that sent it is
	// disconnected, as one whose message is over MaxRecvMsgSize is.
	// Default DefaultMaxDevicesPerResource.
	MaxDevicesPerResource int
	// MaxResources is the most resources plugins may serve at once (a
	// resource counts from its first registration until GetCapacity
	// removes it, and from the checkpoint). A registration of one more is
	// refused. Default DefaultMaxResources.
	MaxResources int
	// MaxInstancesPerResource is the most plugin instances (registrations
	// on different sockets) of one resource connected at once; a
	// registration of one more is refused, a registration again on the same
	// socket is not. Default DefaultMaxInstancesPerResource.
	MaxInstancesPerResource int
	// KeepaliveTime and KeepaliveTimeout: the manager pings a plugin whose
	// connection carried nothing for KeepaliveTime, and disconnects it when
	// nothing comes within KeepaliveTimeout more (endpoint.Options has the
	// details). The default time, 10m, is twice the interval a gRPC
	// server's default policy demands between pings, so that a healthy
	// plugin is never told "too_many_pings". Defaults 10m and 30s.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// RequirePlugin lists resource names, or "domain/*" patterns, that only a
	// device plugin serves: admission of such a resource fails while no plugin
	// has registered it, instead of being ignored as an admin-advertised
	// extended resource.
	RequirePlugin []string
	// PluginWaitTimeout is how long Allocate waits for the plugin of a
	// resource that is not ready (ErrPluginNotReady: after a restart, until
	// its plugin registers again and lists its devices) before it refuses
	// the container; one wait covers all of the container's resources. An
	// empty device list does not end the wait (some plugins send one
	// before their devices). The wait ends early when the caller's context
	// ends (for a resource still not ready, the error wraps both
	// ErrPluginNotReady and the context's error) and when Stop runs
	// (ErrStopped). Zero: refuse at once. Negative durations are refused.
	PluginWaitTimeout time.Duration
	// Clock gives stop times, the grace period and PluginWaitTimeout;
	// default the real clock.
	Clock clock.Clock
	// Logger is the manager's logger; default klog.Background().
	Logger klog.Logger
	// PluginsRegistryDir, when set (absolute), is watched for plugins that
	// register through the pluginregistration v1 protocol (a socket serving
	// GetInfo and NotifyRegistrationStatus) instead of calling kubelet.sock,
	// as the kubelet's plugin watcher does with
	// /var/lib/kubelet/plugins_registry. Empty: not watched.
	PluginsRegistryDir string
	// Events makes the manager report each admission and release of a
	// container's devices on Events(), and keep for UndeliveredEvents()
	// those it had not delivered at Stop; false: nothing is recorded.
	Events bool
	// SendPodInfo makes the manager name the pod and container of each
	// Allocate, GetPreferredAllocation and PreStartContainer call in its
	// gRPC metadata (package podinfo says how a plugin reads it). The
	// kubelet sends no such metadata; false: neither does the manager.
	SendPodInfo bool
	// Registerer receives the manager's Prometheus metrics (the kubelet's
	// kubelet_device_plugin_* and devmgr_*); nil: no metrics are registered.
	Registerer prometheus.Registerer
}

func (o Options) withDefaults() (Options, error) {
	if o.SocketDir == "" {
		o.SocketDir = pluginapi.DevicePluginPath
	}
	if !filepath.IsAbs(o.SocketDir) {
		return o, fmt.Errorf("bad socket directory, must be an absolute path: %q", o.SocketDir)
	}
	if o.CheckpointDir == "" {
		o.CheckpointDir = o.SocketDir
	}
	if !filepath.IsAbs(o.CheckpointDir) {
		return o, fmt.Errorf("bad checkpoint directory, must be an absolute path: %q", o.CheckpointDir)
	}
	if o.PluginsRegistryDir != "" && !filepath.IsAbs(o.PluginsRegistryDir) {
		return o, fmt.Errorf("bad plugins registry directory, must be an absolute path: %q", o.PluginsRegistryDir)
	}
	// A unix socket path has room for 107 bytes; kubelet.sock must fit.
	if n := len(filepath.Join(o.SocketDir, KubeletSocketName)); n > pluginreg.MaxSocketPath {
		return o, fmt.Errorf("socket directory %q too long: %s would be %d bytes, the limit is %d",
			o.SocketDir, KubeletSocketName, n, pluginreg.MaxSocketPath)
	}
	for _, n := range o.NUMANodes {
		if n < 0 || n > 63 {
			return o, fmt.Errorf("NUMA node %d out of range 0-63", n)
		}
	}
	for _, p := range o.RequirePlugin {
		if p == "" || strings.Contains(strings.TrimSuffix(p, "/*"), "*") {
			return o, fmt.Errorf("bad RequirePlugin entry %q: want a resource name or domain/*", p)
		}
	}
	if o.PluginWaitTimeout < 0 {
		return o, fmt.Errorf("bad PluginWaitTimeout %s: must not be negative", o.PluginWaitTimeout)
	}
	positive(&o.StopGracePeriod, DefaultStopGracePeriod)
	positive(&o.CallTimeout, endpoint.DefaultCallTimeout)
	positive(&o.PreStartTimeout, endpoint.DefaultPreStartTimeout)
	positive(&o.DialTimeout, endpoint.DefaultDialTimeout)
	positive(&o.MaxRecvMsgSize, endpoint.DefaultMaxRecvMsgSize)
	positive(&o.MaxDevicesPerResource, DefaultMaxDevicesPerResource)
	positive(&o.MaxResources, DefaultMaxResources)
	positive(&o.MaxInstancesPerResource, DefaultMaxInstancesPerResource)
	positive(&o.KeepaliveTime, endpoint.DefaultKeepaliveTime)
	positive(&o.KeepaliveTimeout, endpoint.DefaultKeepaliveTimeout)
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = klog.Background()
	}
	return o, nil
}

// positive sets *v to def unless it is above zero.
func positive[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

func (o Options) endpointOptions() endpoint.Options {
	return endpoint.Options{
		CallTimeout:      o.CallTimeout,
		PreStartTimeout:  o.PreStartTimeout,
		DialTimeout:      o.DialTimeout,
		MaxRecvMsgSize:   o.MaxRecvMsgSize,
		KeepaliveTime:    o.KeepaliveTime,
		KeepaliveTimeout: o.KeepaliveTimeout,
		Clock:            o.Clock,
	}
}

// requiresPlugin reports whether RequirePlugin names resource.
func (o Options) requiresPlugin(resource string) bool {
	for _, p := range o.RequirePlugin {
		if domain, ok := strings.CutSuffix(p, "/*"); ok {
			if d, _, found := strings.Cut(resource, "/"); found && d == domain {
				return true
			}
		} else if p == resource {
			return true
		}
	}
	return false
}
