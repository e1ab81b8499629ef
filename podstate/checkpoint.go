package podstate

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
)

// ToCheckpoint returns one entry per record, in admission order (the order
// in which each record's pod, container and resource were first recorded;
// for records restored by FromCheckpoint, the order of the entries read),
// with device IDs sorted within each NUMA list and responses in
// deterministic protobuf encoding, so the same history always yields the
// same entries; nil when there is no record. Pending reservations are not
// written.
//
// The returned slice is the caller's, but its entries share their DeviceIDs
// maps and AllocResp bytes with the ledger, which never modifies them: treat
// those as read-only.
//
// A record without a response, or whose response could not be encoded, is
// left out; the returned error then names each such record (errors.Join of
// errors wrapping ErrNoResponse or ErrUnencodableResponse, in admission
// order) while the entries hold everything else.
func (l *Ledger) ToCheckpoint() ([]checkpoint.PodDevicesEntry, error) {
	var entries []checkpoint.PodDevicesEntry
	var errs []error
	for _, r := range l.order {
		if err := r.checkpointable(); err != nil {
			errs = append(errs, fmt.Errorf("pod %q container %q resource %q not checkpointed: %w",
				r.key.pod, r.key.container, r.key.resource, err))
			continue
		}
		if entries == nil {
			entries = make([]checkpoint.PodDevicesEntry, 0, len(l.order))
		}
		entries = append(entries, checkpoint.PodDevicesEntry{
			PodUID: r.key.pod, ContainerName: r.key.container, ResourceName: r.key.resource,
			DeviceIDs: r.numa, AllocResp: r.wire,
		})
	}
	return entries, errors.Join(errs...)
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
