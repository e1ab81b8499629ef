package checkpoint

import (
	"fmt"
	"testing"
)

// benchData is a checkpoint of n pods with one container and one device each,
// on a resource with n healthy devices: the shape of the kubelet's checkpoint
// after n admissions.
func benchData(n int) ([]PodDevicesEntry, map[string][]string) {
	entries := make([]PodDevicesEntry, n)
	healthy := make([]string, n)
	resp := []byte{0x0a, 0x1a, 0x0a, 0x0e, 0x45, 0x58, 0x41, 0x4d, 0x50, 0x4c, 0x45, 0x5f, 0x44, 0x45, 0x56, 0x49, 0x43,
		0x45, 0x12, 0x08, 0x64, 0x65, 0x76, 0x2d, 0x30, 0x30, 0x30, 0x31}
	for i := range n {
		healthy[i] = fmt.Sprintf("dev-%04d", i)
		entries[i] = PodDevicesEntry{
			PodUID:        fmt.Sprintf("7f3c9a8e-1b2d-4e5f-8a9b-%012d", i),
			ContainerName: "app",
			ResourceName:  "example.com/gpu",
			DeviceIDs:     DevicesPerNUMA{int64(i % 2): {healthy[i]}},
			AllocResp:     resp,
		}
	}
	return entries, map[string][]string{"example.com/gpu": healthy}
}

// BenchmarkMarshalCheckpoint encodes a 1,000-entry checkpoint. "new" is a
// new Data each time (every entry encoded and hashed); "append" is one Data
// given each admission's state with SetData, one entry more than the last,
// as the device manager does (only the new entry is encoded and hashed).
func BenchmarkMarshalCheckpoint(b *testing.B) {
	entries, registered := benchData(1001)
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := New(entries[:1000], registered).MarshalCheckpoint(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		d := New(nil, nil)
		i := 0
		for b.Loop() {
			d.SetData(entries[:1000+i%2], registered)
			if _, err := d.MarshalCheckpoint(); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkChecksum/hand and /spew compare the reflection-free checksum with
// the kubelet's reflection-based one on the same 1,000-entry checkpoint.
func BenchmarkChecksum(b *testing.B) {
	entries, registered := benchData(1000)
	d := checkpointData{PodDeviceEntries: entries, RegisteredDevices: registered}
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			checksumOf(&d)
		}
	})
	b.Run("spew", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			spewChecksum(d)
		}
	})
}

// BenchmarkStoreWrite times one durable write of a 1,000-entry checkpoint
// through the store, on the disk under the test's temporary directory.
func BenchmarkStoreWrite(b *testing.B) {
	blob, err := New(benchData(1000)).MarshalCheckpoint()
	if err != nil {
		b.Fatal(err)
	}
	s, err := NewManager(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(blob)))
	for b.Loop() {
		if err := s.CreateCheckpoint(DeviceManagerKey, rawDoc(blob)); err != nil {
			b.Fatal(err)
		}
	}
}

// rawDoc is a checkpoint that marshals to fixed bytes.
type rawDoc []byte

func (d rawDoc) MarshalCheckpoint() ([]byte, error) { return d, nil }
func (rawDoc) UnmarshalCheckpoint([]byte) error     { return nil }
func (rawDoc) VerifyChecksum() error                { return nil }
