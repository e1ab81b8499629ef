package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
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
// given and returns them from GetData without copying; they must not be
// modified while the Data holds them.
type Data struct {
	data     checkpointData
	checksum uint64
	// legacy is set instead of data when the Data was decoded from the layout
	// written before Kubernetes 1.20, so that it re-encodes as it was read.
	legacy *legacyCheckpointData
	// encoded holds, by entry, the encoding of each entry of the last
	// document MarshalCheckpoint wrote (see marshal); docs numbers the
	// documents.
	encoded map[entryKey]*encodedEntry
	docs    uint64
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

// SetData replaces the content of d, as New would build it. A Data that is
// given each new state with SetData, rather than a new Data each time,
// encodes again only the entries that changed since its last
// MarshalCheckpoint: a writer that appends entries pays for the new ones.
func (d *Data) SetData(entries []PodDevicesEntry, registered map[string][]string) {
	d.data = checkpointData{PodDeviceEntries: entries, RegisteredDevices: registered}
	d.legacy = nil
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
// the JSON document the kubelet writes for it, as encoding/json writes it:
// compact, fields in the kubelet's order, map keys sorted, no trailing
// newline. Entries and IDs are encoded in the order given.
func (d *Data) MarshalCheckpoint() ([]byte, error) {
	if d.legacy != nil {
		d.checksum = legacyChecksumOf(d.legacy)
		return json.Marshal(legacyWire{Data: *d.legacy, Checksum: d.checksum})
	}
	return d.marshal()
}

// entryKey names the record an entry holds.
type entryKey struct{ pod, container, resource string }

// encodedEntry is an entry with its JSON and, once hashed, the checksum's
// state before and after the entry's text where it last stood; doc is the
// last document that held it.
type encodedEntry struct {
	entry    PodDevicesEntry
	json     []byte
	hashed   bool
	from, to uint32
	doc      uint64
}

// marshal writes the current layout. The document is the JSON of each entry
// (encoding/json's encoding of the entry, which is what encoding/json writes
// for it inside the whole document) between the fixed text of the wire
// struct, so that an entry whose content has not changed since the last call
// is not encoded again. The checksum is a hash over the whole text in order:
// an entry whose text starts from the state it started from last time ends
// in the same state, so an unchanged prefix of entries costs a comparison
// each.
func (d *Data) marshal() ([]byte, error) {
	entries := d.data.PodDeviceEntries
	if d.encoded == nil {
		d.encoded = make(map[entryKey]*encodedEntry, len(entries))
	}
	d.docs++
	list := make([]*encodedEntry, len(entries))
	size, held := 0, 0
	for i := range entries {
		e := &entries[i]
		k := entryKey{e.PodUID, e.ContainerName, e.ResourceName}
		enc := d.encoded[k]
		if enc == nil || enc.doc != d.docs {
			held++ // the key's first entry in this document
		}
		if enc == nil || !sameContent(&enc.entry, e) {
			js, err := json.Marshal(e)
			if err != nil {
				return nil, err
			}
			// A copy: the caller may reuse its maps and slices for
			// another state.
			enc = &encodedEntry{entry: cloneEntry(e), json: js}
			d.encoded[k] = enc
		}
		enc.doc = d.docs
		list[i] = enc
		size += len(enc.json) + 1
	}
	// Entries of earlier documents that this one does not hold go.
	if len(d.encoded) > held {
		for k, enc := range d.encoded {
			if enc.doc != d.docs {
				delete(d.encoded, k)
			}
		}
	}
	registered, err := json.Marshal(d.data.RegisteredDevices)
	if err != nil {
		return nil, err
	}
	var text []byte
	d.checksum = hashDocument(entries == nil, len(list), func(h uint32, i int) uint32 {
		enc := list[i]
		if !enc.hashed || enc.from != h {
			text = appendEntryText(text[:0], &enc.entry)
			enc.from, enc.to, enc.hashed = h, fnvUpdate(h, text), true
		}
		return enc.to
	}, d.data.RegisteredDevices)

	b := make([]byte, 0, size+len(registered)+128)
	b = append(b, `{"Data":{"PodDeviceEntries":`...)
	if entries == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, enc := range list {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, enc.json...)
		}
		b = append(b, ']')
	}
	b = append(b, `,"RegisteredDevices":`...)
	b = append(b, registered...)
	b = append(b, `},"Checksum":`...)
	b = strconv.AppendUint(b, d.checksum, 10)
	return append(b, '}'), nil
}

// cloneEntry returns a copy of e that shares no memory with it.
func cloneEntry(e *PodDevicesEntry) PodDevicesEntry {
	c := *e
	c.AllocResp = bytes.Clone(e.AllocResp)
	if e.DeviceIDs != nil {
		c.DeviceIDs = make(DevicesPerNUMA, len(e.DeviceIDs))
		for node, ids := range e.DeviceIDs {
			c.DeviceIDs[node] = slices.Clone(ids)
		}
	}
	return c
}

// sameContent reports whether entries a and b of the same key hold the same
// devices and response, nil and empty told apart.
func sameContent(a, b *PodDevicesEntry) bool {
	return (a.AllocResp == nil) == (b.AllocResp == nil) && bytes.Equal(a.AllocResp, b.AllocResp) &&
		(a.DeviceIDs == nil) == (b.DeviceIDs == nil) &&
		maps.EqualFunc(a.DeviceIDs, b.DeviceIDs, func(x, y []string) bool {
			return (x == nil) == (y == nil) && slices.Equal(x, y)
		})
}

// UnmarshalCheckpoint replaces the content of d with the decoded blob. It does
// not verify the checksum (VerifyChecksum does). As in the kubelet, decoding
// starts from an empty entry list and an empty registered map, field names match
// case-insensitively and unknown fields are ignored. The layout written before
// Kubernetes 1.20 is accepted too (see Legacy). A malformed document yields a
// *DecodeError and leaves d unchanged.
func (d *Data) UnmarshalCheckpoint(blob []byte) error {
	w := wire{Data: checkpointData{
		PodDeviceEntries:  []PodDevicesEntry{},
		RegisteredDevices: map[string][]string{},
	}}
	err := json.Unmarshal(blob, &w)
	if err == nil {
		d.data, d.checksum, d.legacy = w.Data, w.Checksum, nil
		return nil
	}
	// Only a document whose DeviceIDs are lists fails above and decodes here.
	lw := legacyWire{Data: legacyCheckpointData{
		PodDeviceEntries:  []legacyEntry{},
		RegisteredDevices: map[string][]string{},
	}}
	if json.Unmarshal(blob, &lw) == nil {
		d.data, d.checksum, d.legacy = checkpointData{}, lw.Checksum, &lw.Data
		return nil
	}
	// Say what is wrong in the file's terms, not in Go's.
	var typeErr *json.UnmarshalTypeError
	switch {
	case len(bytes.TrimSpace(blob)) == 0:
		err = errors.New("file is empty")
	case errors.As(err, &typeErr) && typeErr.Field == "":
		err = fmt.Errorf("not a checkpoint: the document is a JSON %s, not an object", typeErr.Value)
	case errors.As(err, &typeErr):
		err = fmt.Errorf("not a checkpoint: %s cannot hold JSON %s", typeErr.Field, typeErr.Value)
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
