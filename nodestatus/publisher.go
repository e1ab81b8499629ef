// Package nodestatus publishes a device manager's resources in a Node's
// status, for a node agent that embeds devmgr without being a kubelet: the
// scheduler sees extended resources only through status.capacity and
// status.allocatable.
//
// A Publisher writes those two maps for the device-plugin resources only, by
// server-side apply on the node's status subresource under its own field
// manager, so that what other writers own in the same status (conditions,
// cpu and memory, resources they advertise) is left alone. Each apply holds
// every resource the manager reports: a resource it no longer reports (its
// plugin gone for longer than the grace period) is left out, and the API
// server removes it unless another manager owns it too. It applies with
// force: the device-plugin resources are its own, even where another writer
// (a kubelet before it) set them.
//
// After a wipe, the extended resources the node still advertises that no
// field manager but the kubelet or the publisher owns are applied at zero
// once, in the first apply; the applies after it leave out those the
// manager does not report, which removes them.
//
// Between writes it reads the node every CheckInterval and applies again
// when the node was deleted, created anew, or no longer holds what was
// applied.
package nodestatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/openkubelet/devmgr/internal/pluginreg"
)

// Defaults of Options.
const (
	DefaultFieldManager   = "devmgr"
	DefaultPollInterval   = time.Second
	DefaultResyncInterval = 5 * time.Minute
	DefaultCheckInterval  = 10 * time.Second
	DefaultMaxBackoff     = 30 * time.Second
)

// kubeletFieldManager is the field manager of a kubelet's status writes:
// the extended resources it owns on a wiped node are the device manager's.
const kubeletFieldManager = "kubelet"

// DeviceManager is what a Publisher reads of the device manager;
// *devicemanager.ManagerImpl implements it.
type DeviceManager interface {
	// GetCapacity returns the device count and healthy device count of
	// every resource; it also retires resources whose plugin is gone for
	// longer than the grace period (their names are not needed here: a
	// resource left out of an apply is removed).
	GetCapacity() (capacity, allocatable v1.ResourceList, removed []string)
	// ShouldResetExtendedResourceCapacity reports whether the node was
	// wiped (the checkpoint directory is empty).
	ShouldResetExtendedResourceCapacity() bool
}

// Options configures a Publisher. Client, NodeName and Manager are required.
type Options struct {
	Client   kubernetes.Interface
	NodeName string
	Manager  DeviceManager
	// FieldManager names the publisher's writes in the node's managed
	// fields. Default DefaultFieldManager.
	FieldManager string
	// RegisterNode makes the publisher create the Node when it does not
	// exist (with nothing but its name); otherwise it waits for someone
	// else to create it, retrying with backoff.
	RegisterNode bool
	// PollInterval is how often the manager's capacity is read; a change is
	// published at the next read, so changes within one interval make one
	// write. Default DefaultPollInterval.
	PollInterval time.Duration
	// ResyncInterval is how often the status is applied again when nothing
	// changed, which repairs a status someone else overwrote. Default
	// DefaultResyncInterval.
	ResyncInterval time.Duration
	// CheckInterval is how often the node is read between writes: a node
	// deleted, created anew, or whose status lost what was applied, is
	// published again at once. Default DefaultCheckInterval.
	CheckInterval time.Duration
	// MaxBackoff bounds the wait before retrying a failed write; the wait
	// starts at PollInterval and doubles with each failure. Default
	// DefaultMaxBackoff.
	MaxBackoff time.Duration
	// Metrics receives each publish's result; nil: none are recorded.
	// NewMetrics makes one registered with Prometheus.
	Metrics *Metrics
	// Clock default: the real clock.
	Clock  clock.WithTicker
	Logger klog.Logger
}

// Publisher keeps one Node's device-plugin resources in step with a device
// manager. Create it with New and run it with Run.
type Publisher struct {
	opts Options
	log  klog.Logger
	// zeroed are the extended resources found in the status of a node that
	// was wiped, owned by no other field manager: the first apply after the
	// wipe holds those the manager does not report at zero. They are kept
	// until an apply goes through: only an apply takes a resource over from
	// the writer before, so that leaving it out afterwards removes it.
	zeroed []v1.ResourceName
	reset  bool
	// registered: the node was found or created (with RegisterNode).
	registered bool
	// uid of the node the last apply wrote to.
	uid types.UID
}

// New checks opts and returns a Publisher. It asks the manager whether the
// node was wiped (ShouldResetExtendedResourceCapacity), so call it before
// the manager's Start: a plugin that registers writes the checkpoint.
func New(opts Options) (*Publisher, error) {
	switch {
	case opts.Client == nil:
		return nil, errors.New("nodestatus: no Client")
	case opts.NodeName == "":
		return nil, errors.New("nodestatus: no NodeName")
	case opts.Manager == nil:
		return nil, errors.New("nodestatus: no Manager")
	case opts.PollInterval < 0, opts.ResyncInterval < 0, opts.CheckInterval < 0, opts.MaxBackoff < 0:
		return nil, errors.New("nodestatus: negative interval")
	}
	if opts.FieldManager == "" {
		opts.FieldManager = DefaultFieldManager
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.ResyncInterval == 0 {
		opts.ResyncInterval = DefaultResyncInterval
	}
	if opts.CheckInterval == 0 {
		opts.CheckInterval = DefaultCheckInterval
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = DefaultMaxBackoff
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = klog.Background()
	}
	p := &Publisher{opts: opts, log: opts.Logger.WithValues("node", opts.NodeName)}
	p.reset = opts.Manager.ShouldResetExtendedResourceCapacity()
	return p, nil
}

// resources is what one apply writes: quantities by resource name.
type resources struct {
	capacity, allocatable map[v1.ResourceName]int64
}

func (r resources) equal(o resources) bool {
	return maps.Equal(r.capacity, o.capacity) && maps.Equal(r.allocatable, o.allocatable)
}

// Run publishes until ctx ends, then returns ctx's error. A failed write is
// logged, counted and retried with backoff; it never ends Run. Run must not
// be called twice at once.
func (p *Publisher) Run(ctx context.Context) error {
	tick := p.opts.Clock.NewTicker(p.opts.PollInterval)
	defer tick.Stop()
	var (
		last      resources
		published bool      // last is on the node
		lastWrite time.Time // of last
		lastCheck time.Time // last write or read of the node
		failures  int
		retryAt   time.Time
	)
	for {
		now := p.opts.Clock.Now()
		want := p.desired()
		reason := ""
		switch {
		case !published:
			reason = "start"
		case !want.equal(last):
			reason = "changed"
		case failures > 0:
			reason = "retry"
		case now.Sub(lastWrite) >= p.opts.ResyncInterval:
			reason = "resync"
		case now.Sub(lastCheck) >= p.opts.CheckInterval:
			lastCheck = now
			reason = p.check(ctx, last)
		}
		if reason != "" && !now.Before(retryAt) {
			applied, err := p.publish(ctx, want)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				failures++
				delay := p.backoff(failures)
				retryAt = now.Add(delay)
				p.opts.Metrics.observe(resultFailure, time.Time{})
				p.log.Error(err, "Failed to publish device resources in the node status", "failures", failures, "retryIn", delay)
			} else {
				last, published, lastWrite, lastCheck = applied, true, now, now
				failures, retryAt = 0, time.Time{}
				p.opts.Metrics.observe(resultSuccess, now)
				p.log.Info("Published device resources in the node status", "reason", reason,
					"capacity", logged(applied.capacity), "allocatable", logged(applied.allocatable))
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C():
		}
	}
}

// check reads the node and returns why last must be applied again: the node
// is gone, is another node of the same name, or its status does not hold
// last. It returns "" when the node holds last, or when the read failed (the
// next check reads again).
func (p *Publisher) check(ctx context.Context, last resources) string {
	node, err := p.opts.Client.CoreV1().Nodes().Get(ctx, p.opts.NodeName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		p.registered = false
		return "node deleted"
	case err != nil:
		if ctx.Err() == nil {
			p.log.Error(err, "Failed to read the node to check its status")
		}
		return ""
	case node.UID != p.uid:
		return "node created anew"
	case !holds(node.Status.Capacity, last.capacity) || !holds(node.Status.Allocatable, last.allocatable):
		return "status changed"
	}
	return ""
}

// holds reports whether l has each resource of want at its count.
func holds(l v1.ResourceList, want map[v1.ResourceName]int64) bool {
	for name, n := range want {
		q, ok := l[name]
		if !ok || q.Value() != n {
			return false
		}
	}
	return true
}

// backoff is the wait after the given number of consecutive failures:
// PollInterval doubled for each failure but the first, at most MaxBackoff,
// with up to 10% jitter.
func (p *Publisher) backoff(failures int) time.Duration {
	d := p.opts.PollInterval
	for i := 1; i < failures && d < p.opts.MaxBackoff; i++ {
		d *= 2
	}
	return wait.Jitter(min(d, p.opts.MaxBackoff), 0.1)
}

// desired reads the manager's capacity, with the resources zeroed after a
// reset that the manager does not report.
func (p *Publisher) desired() resources {
	capacity, allocatable, _ := p.opts.Manager.GetCapacity()
	r := resources{capacity: values(capacity), allocatable: values(allocatable)}
	for _, name := range p.zeroed {
		if _, ok := r.capacity[name]; !ok {
			r.capacity[name] = 0
			r.allocatable[name] = 0
		}
	}
	return r
}

// publish applies r to the node's status, creating the node first when it is
// missing and RegisterNode is set, and returns what it applied: in the first
// apply after a wipe, r with the extended resources to zero at zero.
func (p *Publisher) publish(ctx context.Context, r resources) (resources, error) {
	if p.opts.RegisterNode && !p.registered {
		if err := p.ensureNode(ctx); err != nil {
			return r, err
		}
		p.registered = true
	}
	if p.reset {
		names, err := p.extendedResources(ctx)
		if err != nil {
			return r, err
		}
		p.zeroed, p.reset = names, false
		if len(names) > 0 {
			p.log.Info("Node was wiped: zeroing the extended resources its plugins do not report", "resources", names)
		}
		r = p.desired()
	}
	node, err := p.opts.Client.CoreV1().Nodes().ApplyStatus(ctx, ApplyConfiguration(p.opts.NodeName, r.capacity, r.allocatable),
		metav1.ApplyOptions{FieldManager: p.opts.FieldManager, Force: true})
	if apierrors.IsNotFound(err) {
		p.registered = false // deleted: created again at the next attempt
		return r, fmt.Errorf("node %s does not exist: %w", p.opts.NodeName, err)
	}
	if err == nil {
		p.zeroed = nil // applied once; the next apply removes what it leaves out
		p.uid = node.UID
	}
	return r, err
}

// ensureNode creates the node unless it exists.
func (p *Publisher) ensureNode(ctx context.Context) error {
	nodes := p.opts.Client.CoreV1().Nodes()
	_, err := nodes.Get(ctx, p.opts.NodeName, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		return err
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: p.opts.NodeName}}
	_, err = nodes.Create(ctx, node, metav1.CreateOptions{FieldManager: p.opts.FieldManager})
	switch {
	case err == nil:
		p.log.Info("Registered node")
	case apierrors.IsAlreadyExists(err):
		err = nil
	}
	return err
}

// extendedResources returns the extended resources in the node's capacity
// that no field manager other than the kubelet and the publisher owns,
// sorted; none for a node that does not exist.
func (p *Publisher) extendedResources(ctx context.Context) ([]v1.ResourceName, error) {
	node, err := p.opts.Client.CoreV1().Nodes().Get(ctx, p.opts.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	others, err := p.ownedByOthers(node.ManagedFields)
	if err != nil {
		p.log.Error(err, "Cannot tell who owns the node's extended resources: none is zeroed")
		return nil, nil
	}
	var names []v1.ResourceName
	for name := range node.Status.Capacity {
		if pluginreg.IsExtendedResourceName(string(name)) && !others[name] {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// ownedByOthers returns the resources in the status capacity or allocatable
// that a field manager other than the kubelet and the publisher owns.
func (p *Publisher) ownedByOthers(entries []metav1.ManagedFieldsEntry) (map[v1.ResourceName]bool, error) {
	owned := map[v1.ResourceName]bool{}
	for _, e := range entries {
		if e.Manager == p.opts.FieldManager || e.Manager == kubeletFieldManager || e.FieldsV1 == nil {
			continue
		}
		var fields struct {
			Status struct {
				Capacity    map[string]json.RawMessage `json:"f:capacity"`
				Allocatable map[string]json.RawMessage `json:"f:allocatable"`
			} `json:"f:status"`
		}
		if err := json.Unmarshal(e.FieldsV1.GetRawBytes(), &fields); err != nil {
			return nil, fmt.Errorf("managed fields of %q: %w", e.Manager, err)
		}
		for _, m := range []map[string]json.RawMessage{fields.Status.Capacity, fields.Status.Allocatable} {
			for key := range m {
				if name, ok := strings.CutPrefix(key, "f:"); ok {
					owned[v1.ResourceName(name)] = true
				}
			}
		}
	}
	return owned, nil
}

// ApplyConfiguration returns the apply configuration of a node status that
// holds exactly the given capacity and allocatable (counts), as a Publisher
// applies it. An empty map is left out, so that applying it removes every
// resource the field manager owned.
func ApplyConfiguration(nodeName string, capacity, allocatable map[v1.ResourceName]int64) *corev1ac.NodeApplyConfiguration {
	status := corev1ac.NodeStatus()
	if len(capacity) > 0 {
		status.WithCapacity(quantities(capacity))
	}
	if len(allocatable) > 0 {
		status.WithAllocatable(quantities(allocatable))
	}
	return corev1ac.Node(nodeName).WithStatus(status)
}

func values(l v1.ResourceList) map[v1.ResourceName]int64 {
	out := make(map[v1.ResourceName]int64, len(l))
	for name, q := range l {
		out[name] = q.Value()
	}
	return out
}

func quantities(m map[v1.ResourceName]int64) v1.ResourceList {
	out := make(v1.ResourceList, len(m))
	for name, n := range m {
		out[name] = *resource.NewQuantity(n, resource.DecimalSI)
	}
	return out
}

// logged turns counts into a map the loggers print as name=count.
func logged(m map[v1.ResourceName]int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for name, n := range m {
		out[string(name)] = n
	}
	return out
}
