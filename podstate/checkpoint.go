package podstate

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
)

// recordKey names one record.
type recordKey struct{ pod, container, resource string }

func compareEntryKey(ee *checkpoint.EncodedEntry, k recordKey) int {
	e := ee.Entry()
	if c := cmp.Compare(e.PodUID, k.pod); c != 0 {
		return c
	}
	if c := cmp.Compare(e.ContainerName, k.container); c != 0 {
		return c
	}
	return cmp.Compare(e.ResourceName, k.resource)
}

// track brings written and unwritable up to date after rec was stored under k.
// Cost: O(log n) to find the place, plus a copy of the entries after it
// (none when records arrive in order, as from a checkpoint).
func (l *Ledger) track(k recordKey, rec *record) {
	i, found := slices.BinarySearchFunc(l.written, k, compareEntryKey)
	err := rec.checkpointable()
	switch {
	case err != nil:
		l.unwritable[k] = err
		if found {
			l.written = slices.Delete(l.written, i, i+1)
		}
		return
	}
	enc := checkpoint.EncodeEntry(checkpoint.PodDevicesEntry{
		PodUID: k.pod, ContainerName: k.container, ResourceName: k.resource,
		DeviceIDs: rec.numa, AllocResp: rec.wire,
	})
	if found {
		l.written[i] = enc
	} else {
		l.written = slices.Insert(l.written, i, enc)
	}
	delete(l.unwritable, k)
}

// untrack forgets the record k.
func (l *Ledger) untrack(k recordKey) {
	delete(l.unwritable, k)
	if i, found := slices.BinarySearchFunc(l.written, k, compareEntryKey); found {
		l.written = slices.Delete(l.written, i, i+1)
	}
}

// untrackPods forgets every record of the pods, in one pass.
func (l *Ledger) untrackPods(uids sets.Set[string]) {
	if uids.Len() == 0 {
		return
	}
	for k := range l.unwritable {
		if uids.Has(k.pod) {
			delete(l.unwritable, k)
		}
	}
	l.written = slices.DeleteFunc(l.written, func(e *checkpoint.EncodedEntry) bool { return uids.Has(e.Entry().PodUID) })
}

// ToCheckpoint returns one entry per record, sorted by (PodUID,
// ContainerName, ResourceName), device IDs sorted within each NUMA list and
// responses in deterministic protobuf encoding, so the same ledger always
// yields the same entries; nil when there is no record. Pending reservations
// are not written.
//
// The entries are kept sorted as records change and responses are encoded
// once, by Insert, so the cost is one copy of the slice. The returned slice is
// the caller's, but its entries share their DeviceIDs maps and AllocResp bytes
// with the ledger, which never modifies them: treat those as read-only.
//
// A record without a response, or whose response could not be encoded, is
// left out; the returned error then names each such record (errors.Join of
// errors wrapping ErrNoResponse or ErrUnencodableResponse, in key order) while
// the entries hold everything else.
func (l *Ledger) ToCheckpoint() ([]checkpoint.PodDevicesEntry, error) {
	var entries []checkpoint.PodDevicesEntry
	if len(l.written) > 0 {
		entries = make([]checkpoint.PodDevicesEntry, len(l.written))
		for i, e := range l.written {
			entries[i] = e.Entry()
		}
	}
	return entries, l.unwritableErr()
}

// ToEncoded is ToCheckpoint with each entry already encoded for a
// checkpoint.Encoder: every record is encoded once, when it is stored, and
// an unchanged record is the same *EncodedEntry from call to call, so the
// encoder reuses its encoding. The slice is the caller's; the entries are
// immutable.
func (l *Ledger) ToEncoded() ([]*checkpoint.EncodedEntry, error) {
	var entries []*checkpoint.EncodedEntry
	if len(l.written) > 0 {
		entries = slices.Clone(l.written)
	}
	return entries, l.unwritableErr()
}

// Encoded returns the entry ToEncoded holds for the container's record of
// resource, or nil when there is none (no record, or one the checkpoint
// cannot hold).
func (l *Ledger) Encoded(podUID, containerName, resource string) *checkpoint.EncodedEntry {
	i, found := slices.BinarySearchFunc(l.written, recordKey{podUID, containerName, resource}, compareEntryKey)
	if !found {
		return nil
	}
	return l.written[i]
}

// unwritableErr names, in key order, the records left out of the checkpoint.
func (l *Ledger) unwritableErr() error {
	if len(l.unwritable) == 0 {
		return nil
	}
	keys := slices.SortedFunc(maps.Keys(l.unwritable), func(a, b recordKey) int {
		return cmp.Or(cmp.Compare(a.pod, b.pod), cmp.Compare(a.container, b.container), cmp.Compare(a.resource, b.resource))
	})
	errs := make([]error, 0, len(keys))
	for _, k := range keys {
		errs = append(errs, fmt.Errorf("pod %q container %q resource %q not checkpointed: %w",
			k.pod, k.container, k.resource, l.unwritable[k]))
	}
	return errors.Join(errs...)
}

func (r *record) checkpointable() error {
	switch {
	case r.resp == nil:
		return ErrNoResponse
	case r.wireErr != nil:
		return fmt.Errorf("%w: %w", ErrUnencodableResponse, r.wireErr)
	}
	return nil
}

// FromCheckpoint inserts a record for each entry, as Insert does (a later
// entry for the same pod, container and resource replaces an earlier one),
// keeping the entry's AllocResp bytes as the record's encoding. A nil
// AllocResp restores an empty response. An entry whose AllocResp does not
// decode is skipped; the returned error then names each skipped entry
// (errors.Join of errors wrapping ErrUndecodableResponse) while every other
// entry is restored.
func (l *Ledger) FromCheckpoint(entries []checkpoint.PodDevicesEntry) error {
	var errs []error
	for i, e := range entries {
		resp := &pluginapi.ContainerAllocateResponse{}
		if err := proto.Unmarshal(e.AllocResp, resp); err != nil {
			errs = append(errs, fmt.Errorf("checkpoint entry %d (pod %q container %q resource %q) skipped: %w: %w",
				i, e.PodUID, e.ContainerName, e.ResourceName, ErrUndecodableResponse, err))
			continue
		}
		// The bytes read are resp's encoding: kept, not encoded again, so a
		// restored record writes back what was read.
		l.put(ContainerRef{PodUID: e.PodUID, ContainerName: e.ContainerName}, e.ResourceName,
			newRecord(e.DeviceIDs, resp, e.AllocResp))
	}
	return errors.Join(errs...)
}
