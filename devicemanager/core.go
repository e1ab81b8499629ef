package devicemanager

import (
	"time"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/endpoint"
	"github.com/openkubelet/devmgr/podstate"
	"github.com/openkubelet/devmgr/topology"
)

// core is the manager's state and the rules that change it: a record per
// resource (its plugin instances, devices and their health), the ledger of
// allocations, and an admission record per pod. It holds no lock, starts no
// goroutine, reads no clock and does no I/O. ManagerImpl holds its lock
// around every call, passes the time where a rule needs it, calls the
// plugins between transitions with the lock released, and carries out what
// a transition returns (effects): the sends on Updates and Events, the
// checkpoint write, the wake-ups of those waiting for a change.
//
// Each concern's rules sit beside the manager's side of it: registration.go,
// devices.go, allocate.go, gc.go, capacity.go, notready.go.
type core struct {
	limits
	resources map[string]*resourceState
	ledger    *podstate.Ledger
	pods      map[string]*admission
	// gen counts changes of the checkpoint's content; commits numbers the
	// recorded admissions; conns numbers registrations.
	gen, commits, conns uint64
}

// limits are the options the rules read.
type limits struct {
	maxResources, maxInstances, maxDevices int
	grace                                  time.Duration // StopGracePeriod
	numaNodes                              []int
	events                                 bool // Events are reported
}

// admission is what the manager keeps of one pod besides its allocations,
// from its first Allocate until garbage collection drops it.
type admission struct {
	// calls counts its Allocate calls in progress: while one runs, the pod
	// is not garbage-collected and keeps its reuse pool.
	calls int
	// reuse holds, per resource, the devices its regular init containers
	// used, which its later containers take first. Dropped when another
	// pod's admission begins.
	reuse map[string]sets.Set[string]
	// lastCommit is core.commits when its last allocation was recorded: a
	// list of active pods read before then may not name it yet.
	lastCommit uint64
}

// effects is what a transition leaves to the manager.
type effects struct {
	// notify names the pods whose devices changed health (Updates).
	notify []string
	// events are admissions and releases to report (Events).
	events []Event
	// write: the checkpoint's content changed, up to generation gen.
	write bool
	gen   uint64
	// ready: a resource became ready, listed devices, or went away:
	// admissions waiting for a plugin look again.
	ready bool
	// settled: a reservation was committed or rolled back: checkpoint
	// writes waiting for in-flight plugin calls look again.
	settled bool
}

// merge adds o to e.
func (e *effects) merge(o effects) {
	e.notify = append(e.notify, o.notify...)
	e.events = append(e.events, o.events...)
	if o.write {
		e.write, e.gen = true, max(e.gen, o.gen)
	}
	e.ready = e.ready || o.ready
	e.settled = e.settled || o.settled
}

func newCore(l limits) *core {
	return &core{
		limits:    l,
		resources: map[string]*resourceState{},
		ledger:    podstate.NewLedger(),
		pods:      map[string]*admission{},
	}
}

// changed records a change of the checkpoint's content and returns the
// effect of writing it.
func (c *core) changed() effects {
	c.gen++
	return effects{write: true, gen: c.gen}
}

// resource returns the record of name, creating it.
func (c *core) resource(name string) *resourceState {
	r := c.resources[name]
	if r == nil {
		r = newResource(name)
		c.resources[name] = r
	}
	return r
}

// census returns r's census, building it if stale.
func (c *core) census(r *resourceState) *topology.Census {
	if r.census == nil {
		r.census = topology.CountDevices(r.byID, len(r.devices), r.isHealthy)
	}
	return r.census
}

// isDevicePluginResource reports whether resource is served by a device
// plugin: registered now (or restored from the checkpoint), or holding
// allocations.
func (c *core) isDevicePluginResource(name string) bool {
	if r := c.resources[name]; r != nil && r.registered {
		return true
	}
	return c.ledger.AllocatedCount(name) > 0
}

// freeDevices is a resource's free devices: healthy, and held by no record
// or reservation. It reads the core: use it before the next transition.
type freeDevices struct {
	r      *resourceState
	ledger *podstate.Ledger
	n      int
}

// free returns r's free devices.
func (c *core) free(r *resourceState) freeDevices {
	n := r.healthyLen()
	for id := range c.ledger.AllocatedIDs(r.name) {
		if r.isHealthy(id) {
			n--
		}
	}
	return freeDevices{r: r, ledger: c.ledger, n: n}
}

func (f freeDevices) Len() int { return f.n }
func (f freeDevices) Has(id string) bool {
	return f.r.isHealthy(id) && !f.ledger.IsAllocated(f.r.name, id)
}

// endpoints returns every endpoint the core holds a connected instance of.
func (c *core) endpoints() []*endpoint.Endpoint {
	var eps []*endpoint.Endpoint
	for _, r := range c.resources {
		for _, in := range r.instances {
			eps = append(eps, in.ep)
		}
	}
	return eps
}

// snapshot returns the checkpoint's content: the ledger's entries, in
// admission order, and the sorted healthy IDs of each registered resource.
// err reports records that cannot be written (the rest are).
func (c *core) snapshot() (entries []checkpoint.PodDevicesEntry, registered map[string][]string, err error) {
	entries, err = c.ledger.ToCheckpoint()
	registered = make(map[string][]string, len(c.resources))
	for name, r := range c.resources {
		if r.registered {
			registered[name] = r.sortedHealthy()
		}
	}
	return entries, registered, err
}

// restore loads a checkpoint's content into an empty core: the
// allocations, and each registered resource, with stopped(name) standing in
// for its plugin until one registers. err reports entries that could not be
// restored (the rest are).
func (c *core) restore(entries []checkpoint.PodDevicesEntry, registered map[string][]string,
	stopped func(name string) *endpoint.Endpoint) error {
	err := c.ledger.FromCheckpoint(entries)
	for name := range registered {
		r := c.resource(name)
		r.registered = true
		r.primary = stopped(name)
	}
	return err
}

// graceOver reports whether ep was stopped more than the grace period
// before now.
func (c *core) graceOver(ep *endpoint.Endpoint, now time.Time) bool {
	t := ep.StopTime()
	return !t.IsZero() && now.Sub(t) > c.grace
}
