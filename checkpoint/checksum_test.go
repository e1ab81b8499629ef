package checkpoint

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	legacyspew "github.com/openkubelet/devmgr/checkpoint/internal/legacyspew"
)

var update = flag.Bool("update", false, "rewrite the golden files (hashed-text.txt) under testdata")

func readFixture(t testing.TB, name, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtureDir, name, file))
	require.NoError(t, err)
	return b
}

// checkGolden compares got with the golden file of the fixture, or rewrites
// the file with -update.
func checkGolden(t *testing.T, name, file, got string) {
	t.Helper()
	if *update {
		require.NoError(t, os.WriteFile(filepath.Join(fixtureDir, name, file), []byte(got), 0o644))
		return
	}
	assert.Equal(t, string(readFixture(t, name, file)), got)
}

// The text go-spew prints for the kubelet's fixtures is the golden text
// (hashed-text.txt, what the kubelet hashed), and the checksum over it is the
// one stored in the fixture: the reference the reflection-free checksum is
// held to is right.
func TestSpewReferenceMatchesKubeletHashedText(t *testing.T) {
	for _, name := range []string{"sample", "empty"} {
		t.Run(name, func(t *testing.T) {
			var d Data
			require.NoError(t, d.UnmarshalCheckpoint(readFixture(t, name, DeviceManagerKey)))
			checkGolden(t, name, "hashed-text.txt", spewText(d.data))
			assert.Equal(t, d.Checksum(), spewChecksum(d.data))
		})
	}
	t.Run("legacy-v1-valid", func(t *testing.T) {
		var d Data
		require.NoError(t, d.UnmarshalCheckpoint(readFixture(t, "legacy-v1-valid", DeviceManagerKey)))
		require.True(t, d.Legacy())
		checkGolden(t, "legacy-v1-valid", "hashed-text.txt", legacyspew.Text(legacyRefEntries(d.legacy), d.legacy.RegisteredDevices))
		assert.Equal(t, d.Checksum(), legacySpewChecksum(d.legacy))
	})
}

func TestReferenceChecksums(t *testing.T) {
	sample := checkpointData{
		PodDeviceEntries: []PodDevicesEntry{{
			PodUID: "pod-uid-1", ContainerName: "ctr", ResourceName: "example.com/dev",
			DeviceIDs: DevicesPerNUMA{0: {"dev-0", "dev-1"}},
			AllocResp: []byte{0x0a, 0x06, 0x0a, 0x01, 0x41, 0x12, 0x01, 0x31},
		}},
		RegisteredDevices: map[string][]string{"example.com/dev": {"dev-0", "dev-1", "dev-2"}},
	}
	tests := []struct {
		name string
		data checkpointData
		want uint64
	}{
		{"sample", sample, 648430460},
		{"nil entries, empty registered", checkpointData{RegisteredDevices: map[string][]string{}}, 3467439661},
		{"empty entries, empty registered", checkpointData{PodDeviceEntries: []PodDevicesEntry{}, RegisteredDevices: map[string][]string{}}, 2932075448},
		{"nil entries, resource without healthy devices", checkpointData{RegisteredDevices: map[string][]string{"example.com/dev": {}}}, 4190085820},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, checksumOf(&tc.data), "hand-written")
			assert.Equal(t, tc.want, spewChecksum(tc.data), "go-spew reference")
		})
	}
}

// The hand-written checksum equals go-spew's on thousands of arbitrary values,
// in the current and in the pre-1.20 layout.
func TestChecksumMatchesSpewOnRandomData(t *testing.T) {
	g := newGen(1, 2)
	for i := range 3000 {
		d := g.data()
		if got, want := checksumOf(&d), spewChecksum(d); got != want {
			t.Fatalf("case %d: checksum %d, go-spew %d for\n%s", i, got, want, spewText(d))
		}
	}
	for i := range 1000 {
		d := g.legacy()
		if got, want := legacyChecksumOf(&d), legacySpewChecksum(&d); got != want {
			t.Fatalf("legacy case %d: checksum %d, go-spew %d for\n%s", i, got, want,
				legacyspew.Text(legacyRefEntries(&d), d.RegisteredDevices))
		}
	}
}

// FuzzChecksumMatchesSpew lets the fuzzer choose every string and byte of a
// two-entry checkpoint (invalid UTF-8 included) and the shape of its nil and
// empty parts; the reflection-free checksum must equal go-spew's, and the
// document encoding/json's.
func FuzzChecksumMatchesSpew(f *testing.F) {
	f.Add("pod-uid-1", "ctr", "example.com/dev", int64(0), "dev-0,dev-1", []byte{10, 6}, "example.com/dev", "dev-0", uint16(0))
	f.Add("", "", "", int64(-1), "", []byte{}, "", "", uint16(0xffff))
	f.Add("p\x00", "c d", "r:[x]", int64(10), "a,,b", []byte(nil), "k\xff", "<nil>", uint16(0x5a5a))
	f.Fuzz(func(t *testing.T, pod, ctr, res string, numa int64, ids string, resp []byte, regKey, regIDs string, shape uint16) {
		bit := func(i int) bool { return shape&(1<<i) != 0 }
		list := func(s string, nilBit, emptyBit int) []string {
			switch {
			case bit(nilBit):
				return nil
			case bit(emptyBit):
				return []string{}
			}
			return strings.Split(s, ",")
		}
		d := checkpointData{}
		if !bit(0) {
			d.PodDeviceEntries = []PodDevicesEntry{}
			for i := range 2 {
				if bit(1 + i) {
					continue
				}
				e := PodDevicesEntry{PodUID: pod, ContainerName: ctr, ResourceName: res}
				if !bit(3) {
					e.DeviceIDs = DevicesPerNUMA{numa: list(ids, 4, 5), numa - 11: list(regIDs, 6, 7)}
				}
				if !bit(8) {
					e.AllocResp = resp
					if e.AllocResp == nil {
						e.AllocResp = []byte{}
					}
				}
				d.PodDeviceEntries = append(d.PodDeviceEntries, e)
			}
		}
		if !bit(9) {
			d.RegisteredDevices = map[string][]string{regKey: list(regIDs, 10, 11), res: list(ids, 12, 13)}
		}
		if got, want := checksumOf(&d), spewChecksum(d); got != want {
			t.Fatalf("checksum %d, go-spew %d for\n%s", got, want, spewText(d))
		}
		doc, err := New(d.PodDeviceEntries, d.RegisteredDevices).MarshalCheckpoint()
		require.NoError(t, err)
		want, err := json.Marshal(wire{Data: d, Checksum: spewChecksum(d)})
		require.NoError(t, err)
		require.Equal(t, string(want), string(doc), "the document is encoding/json's")
		ld := legacyCheckpointData{RegisteredDevices: d.RegisteredDevices}
		for _, e := range d.PodDeviceEntries {
			ld.PodDeviceEntries = append(ld.PodDeviceEntries, legacyEntry{
				PodUID: e.PodUID, ContainerName: e.ContainerName, ResourceName: e.ResourceName,
				DeviceIDs: e.DeviceIDs[numa], AllocResp: e.AllocResp,
			})
		}
		if got, want := legacyChecksumOf(&ld), legacySpewChecksum(&ld); got != want {
			t.Fatalf("legacy checksum %d, go-spew %d", got, want)
		}
	})
}
