package checkpoint

import (
	"encoding/json"
)

// Checkpoint is what the store reads and writes: a value that encodes itself
// with its checksum, decodes itself, and verifies the checksum it decoded.
type Checkpoint interface {
	MarshalCheckpoint() ([]byte, error)
	UnmarshalCheckpoint(blob []byte) error
	VerifyChecksum() error
}

// Data is the device manager's checkpoint: allocation records and the healthy
// device IDs of each registered resource. It is a Checkpoint.
//
// A Data is not safe for concurrent use. It keeps the slices and maps it is
// given and returns them from GetData without copying.
type Data struct {
	data     checkpointData
	checksum uint64
	// legacy is set instead of data when the Data was decoded from the layout
	// written before Kubernetes 1.20, so that it re-encodes as it was read.
	legacy *legacyCheckpointData
}

var _ Checkpoint = (*Data)(nil)

// wire is the JSON document: {"Data":{...},"Checksum":N}.
type wire struct {
	Data     checkpointData
	Checksum uint64
}

// legacyEntry is an entry of the layout written before Kubernetes 1.20, when a
// record did not say on which NUMA node its devices were.
type legacyEntry struct {
	PodUID        string
	ContainerName string
	ResourceName  string
	DeviceIDs     []string
	AllocResp     []byte
}

type legacyCheckpointData struct {
	PodDeviceEntries  []legacyEntry
	RegisteredDevices map[string][]string
}

type legacyWire struct {
	Data     legacyCheckpointData
	Checksum uint64
}

// New returns a checkpoint holding entries, in the order given, and the device
// IDs registered per resource. nil and empty values are kept apart: they encode
// (and hash) differently, exactly as in the kubelet.
func New(entries []PodDevicesEntry, registered map[string][]string) *Data {
	return &Data{data: checkpointData{PodDeviceEntries: entries, RegisteredDevices: registered}}
}

// GetData returns the allocation records and the registered devices. For a
// checkpoint decoded from the pre-1.20 layout, each record's devices are listed
// under NUMA node -1 (no topology), which is what that layout meant.
func (d *Data) GetData() ([]PodDevicesEntry, map[string][]string) {
	if d.legacy == nil {
		return d.data.PodDeviceEntries, d.data.RegisteredDevices
	}
	var entries []PodDevicesEntry
	if d.legacy.PodDeviceEntries != nil {
		entries = make([]PodDevicesEntry, 0, len(d.legacy.PodDeviceEntries))
	}
	for _, e := range d.legacy.PodDeviceEntries {
		var ids DevicesPerNUMA
		if e.DeviceIDs != nil {
			ids = DevicesPerNUMA{-1: e.DeviceIDs}
		}
		entries = append(entries, PodDevicesEntry{
			PodUID:        e.PodUID,
			ContainerName: e.ContainerName,
			ResourceName:  e.ResourceName,
			DeviceIDs:     ids,
			AllocResp:     e.AllocResp,
		})
	}
	return entries, d.legacy.RegisteredDevices
}

// Legacy reports whether d was decoded from the layout written before
// Kubernetes 1.20 (DeviceIDs as a plain list). Such a Data re-encodes in that
// layout; build a new one with New to write the current layout.
func (d *Data) Legacy() bool { return d.legacy != nil }

// Checksum returns the checksum stored with the content: the one decoded by
// UnmarshalCheckpoint, or the one computed by the last MarshalCheckpoint.
func (d *Data) Checksum() uint64 { return d.checksum }

// MarshalCheckpoint computes the kubelet's checksum of the content and returns
// the JSON document the kubelet writes for it: compact, fields in the kubelet's
// order, no trailing newline. Entries and IDs are encoded in the order given.
func (d *Data) MarshalCheckpoint() ([]byte, error) {
	if d.legacy != nil {
		d.checksum = legacyChecksumOf(d.legacy)
		return encodeLegacyJSON(d.legacy, d.checksum), nil
	}
	d.checksum = checksumOf(&d.data)
	return encodeJSON(&d.data, d.checksum), nil
}

// UnmarshalCheckpoint replaces the content of d with the decoded blob. It does
// not verify the checksum (VerifyChecksum does). As in the kubelet, decoding
// starts from an empty entry list and an empty registered map, field names match
// case-insensitively and unknown fields are ignored. The layout written before
// Kubernetes 1.20 is accepted too (see Legacy). A malformed document yields a
// *DecodeError and leaves d unchanged.
func (d *Data) UnmarshalCheckpoint(blob []byte) error {
	if w, ok := decodeCanonical(blob); ok {
		*d = Data{data: w.Data, checksum: w.Checksum}
		return nil
	}
	w := wire{Data: checkpointData{
		PodDeviceEntries:  []PodDevicesEntry{},
		RegisteredDevices: map[string][]string{},
	}}
	err := json.Unmarshal(blob, &w)
	if err == nil {
		*d = Data{data: w.Data, checksum: w.Checksum}
		return nil
	}
	// Only a document whose DeviceIDs are lists fails above and decodes here.
	lw := legacyWire{Data: legacyCheckpointData{
		PodDeviceEntries:  []legacyEntry{},
		RegisteredDevices: map[string][]string{},
	}}
	if json.Unmarshal(blob, &lw) == nil {
		*d = Data{legacy: &lw.Data, checksum: lw.Checksum}
		return nil
	}
	return &DecodeError{Err: err}
}

// VerifyChecksum recomputes the checksum of the content and compares it with
// the stored one. A mismatch is a *CorruptError.
func (d *Data) VerifyChecksum() error {
	var actual uint64
	if d.legacy != nil {
		actual = legacyChecksumOf(d.legacy)
	} else {
		actual = checksumOf(&d.data)
	}
	if actual != d.checksum {
		return &CorruptError{ActualCS: actual, ExpectedCS: d.checksum}
	}
	return nil
}
