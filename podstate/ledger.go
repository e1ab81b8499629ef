package podstate

import (
	"iter"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
)

// Ledger records which devices each container holds and the plugin's Allocate
// response for them, with the pending reservations and the index that the
// package doc describes. It is not safe for concurrent use. The zero value is
// not usable: call NewLedger.
type Ledger struct {
	pods map[string]map[string]map[string]*record // podUID -> container -> resource
	// order holds every record in the order its key was first recorded
	// (admission order), for ToCheckpoint.
	order []*record

	// index: resource -> device ID -> who holds it (records and reservations).
	// A device is allocated iff it has an entry.
	index map[string]map[string]*holders

	pending map[ReservationID]*reservation
	lastID  ReservationID
}

// recordKey names one record.
type recordKey struct{ pod, container, resource string }

// record is one (pod, container, resource) allocation. It is never modified
// after it is built: put replaces it, so its maps and slices may be shared
// with the entries ToCheckpoint returns.
type record struct {
	key  recordKey
	numa checkpoint.DevicesPerNUMA // every list sorted
	ids  []string                  // distinct IDs over all NUMA lists, sorted
	resp *pluginapi.ContainerAllocateResponse
	wire []byte // deterministic encoding of resp; nil when resp is nil or wireErr is set
	// wireErr is the encoding error, reported by ToCheckpoint.
	wireErr error
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{
		pods:    make(map[string]map[string]map[string]*record),
		index:   make(map[string]map[string]*holders),
		pending: make(map[ReservationID]*reservation),
	}
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// newRecord builds a record; wire, when not nil, is resp's encoding already
// (as read from a checkpoint) and is kept instead of encoding resp again.
func newRecord(numa checkpoint.DevicesPerNUMA, resp *pluginapi.ContainerAllocateResponse, wire []byte) *record {
	r := &record{numa: make(checkpoint.DevicesPerNUMA, len(numa)), resp: resp}
	all := make([]string, 0, len(numa))
	for node, ids := range numa {
		list := slices.Clone(ids)
		slices.Sort(list)
		r.numa[node] = list
		all = append(all, list...)
	}
	slices.Sort(all)
	r.ids = slices.Compact(all)
	switch {
	case resp != nil && wire != nil:
		r.wire = wire
	case resp != nil:
		r.wire, r.wireErr = deterministic.Marshal(resp)
		if r.wireErr != nil {
			r.wire = nil
		}
	}
	return r
}

// Insert records that (podUID, containerName) holds the devices of numa for
// resource, with the plugin's response, replacing any earlier record for the
// same three keys (its devices are released unless still held otherwise;
// the new record takes its place in admission order). numa is copied; resp
// is kept as given and must not be modified afterwards. A nil resp is
// allowed: the devices are held, but the record is left out of the
// checkpoint and of the run options.
func (l *Ledger) Insert(podUID, containerName, resource string, numa checkpoint.DevicesPerNUMA,
	resp *pluginapi.ContainerAllocateResponse) {
	l.put(ContainerRef{PodUID: podUID, ContainerName: containerName}, resource, newRecord(numa, resp, nil))
}

func (l *Ledger) put(ref ContainerRef, resource string, rec *record) {
	rec.key = recordKey{ref.PodUID, ref.ContainerName, resource}
	ctrs := l.pods[ref.PodUID]
	if ctrs == nil {
		ctrs = make(map[string]map[string]*record)
		l.pods[ref.PodUID] = ctrs
	}
	recs := ctrs[ref.ContainerName]
	if recs == nil {
		recs = make(map[string]*record)
		ctrs[ref.ContainerName] = recs
	}
	if old := recs[resource]; old != nil {
		l.release(resource, old.ids, ref)
		l.order[slices.Index(l.order, old)] = rec
	} else {
		l.order = append(l.order, rec)
	}
	recs[resource] = rec
	l.hold(resource, rec.ids, ref)
}

// DeletePods drops every record of the given pods and releases their devices.
// Pending reservations are kept, whatever pod made them.
func (l *Ledger) DeletePods(podUIDs ...string) {
	gone := sets.New[string]()
	for _, uid := range podUIDs {
		ctrs, ok := l.pods[uid]
		if !ok {
			continue
		}
		for name, recs := range ctrs {
			ref := ContainerRef{PodUID: uid, ContainerName: name}
			for res, rec := range recs {
				l.release(res, rec.ids, ref)
			}
		}
		delete(l.pods, uid)
		gone.Insert(uid)
	}
	if gone.Len() > 0 {
		l.order = slices.DeleteFunc(l.order, func(r *record) bool { return gone.Has(r.key.pod) })
	}
}

// Holding is what one container holds of one resource.
type Holding struct {
	PodUID, ContainerName, Resource string
	// DeviceIDs are distinct and sorted; the slice is the caller's.
	DeviceIDs []string
}

// Holdings returns what the given pods hold, one Holding per container and
// resource, in admission order. Pending reservations are not included.
func (l *Ledger) Holdings(podUIDs ...string) []Holding {
	want := sets.New(podUIDs...)
	var out []Holding
	for _, r := range l.order {
		if want.Has(r.key.pod) {
			out = append(out, Holding{
				PodUID: r.key.pod, ContainerName: r.key.container, Resource: r.key.resource,
				DeviceIDs: slices.Clone(r.ids),
			})
		}
	}
	return out
}

// DeleteContainerResources drops the records of (podUID, containerName) for
// the given resources and releases their devices; resources without a record
// are ignored. It undoes a container's partial admission.
func (l *Ledger) DeleteContainerResources(podUID, containerName string, resources ...string) {
	ctrs := l.pods[podUID]
	recs := ctrs[containerName]
	if recs == nil {
		return
	}
	ref := ContainerRef{PodUID: podUID, ContainerName: containerName}
	gone := make(map[*record]bool, len(resources))
	for _, res := range resources {
		if rec := recs[res]; rec != nil {
			l.release(res, rec.ids, ref)
			gone[rec] = true
			delete(recs, res)
		}
	}
	l.order = slices.DeleteFunc(l.order, func(r *record) bool { return gone[r] })
	if len(recs) == 0 {
		delete(ctrs, containerName)
	}
	if len(ctrs) == 0 {
		delete(l.pods, podUID)
	}
}

// Pods yields the UIDs of the pods that have records, in no particular
// order. The ledger must not change during the iteration.
func (l *Ledger) Pods() iter.Seq[string] { return maps.Keys(l.pods) }

// Len returns the number of pods that have records.
func (l *Ledger) Len() int { return len(l.pods) }

// HasPod reports whether the pod has records.
func (l *Ledger) HasPod(podUID string) bool {
	_, ok := l.pods[podUID]
	return ok
}

// ContainerDevices returns the device IDs recorded for the container and
// resource, or nil when the pod, the container or the record is absent.
func (l *Ledger) ContainerDevices(podUID, containerName, resource string) sets.Set[string] {
	rec := l.pods[podUID][containerName][resource]
	if rec == nil {
		return nil
	}
	return sets.New(rec.ids...)
}

// PodDevices returns the union of the device IDs recorded for resource over
// the pod's containers; never nil.
func (l *Ledger) PodDevices(podUID, resource string) sets.Set[string] {
	out := sets.New[string]()
	for _, recs := range l.pods[podUID] {
		if rec := recs[resource]; rec != nil {
			out.Insert(rec.ids...)
		}
	}
	return out
}
