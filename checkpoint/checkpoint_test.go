package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fixtureDir holds checkpoint files written by the kubelet's own code (v1.37.2).
const fixtureDir = "../testdata/kubelet-checkpoints"

func sampleEntries() []PodDevicesEntry {
	return []PodDevicesEntry{{
		PodUID: "pod-uid-1", ContainerName: "ctr", ResourceName: "example.com/dev",
		DeviceIDs: DevicesPerNUMA{0: {"dev-0", "dev-1"}},
		AllocResp: []byte{0x0a, 0x06, 0x0a, 0x01, 0x41, 0x12, 0x01, 0x31},
	}}
}

func sampleRegistered() map[string][]string {
	return map[string][]string{"example.com/dev": {"dev-0", "dev-1", "dev-2"}}
}

// Each fixture decodes, verifies or fails exactly as the kubelet does, and
// whatever decodes re-encodes to the expected bytes.
func TestKubeletFixtures(t *testing.T) {
	sample := readFixture(t, "sample", DeviceManagerKey)
	tests := []struct {
		name           string
		wantEntries    []PodDevicesEntry
		wantRegistered map[string][]string
		wantChecksum   uint64
		wantLegacy     bool
		// reencoded is what MarshalCheckpoint must produce; nil: the fixture itself.
		reencoded []byte
		// check the error of GetCheckpoint; nil: must succeed.
		wantErr func(t *testing.T, err error)
	}{
		{
			name: "sample", wantEntries: sampleEntries(), wantRegistered: sampleRegistered(),
			wantChecksum: 648430460,
		},
		{
			name: "empty", wantEntries: nil, wantRegistered: map[string][]string{},
			wantChecksum: 3467439661,
		},
		{
			name: "reformatted", wantEntries: sampleEntries(), wantRegistered: sampleRegistered(),
			wantChecksum: 648430460, reencoded: sample,
		},
		{
			name: "legacy-v1-valid", wantRegistered: sampleRegistered(), wantChecksum: 4073806608, wantLegacy: true,
			wantEntries: []PodDevicesEntry{{
				PodUID: "pod-uid-1", ContainerName: "ctr", ResourceName: "example.com/dev",
				DeviceIDs: DevicesPerNUMA{-1: {"dev-0", "dev-1"}},
				AllocResp: []byte{0x0a, 0x06, 0x0a, 0x01, 0x41, 0x12, 0x01, 0x31},
			}},
		},
		{
			name: "corrupt",
			wantErr: func(t *testing.T, err error) {
				var ce *CorruptError
				require.ErrorAs(t, err, &ce)
				assert.Equal(t, CorruptError{ActualCS: 648430460, ExpectedCS: 648430461}, *ce)
				assert.EqualError(t, err, "checkpoint is corrupted")
			},
		},
		{
			name: "legacy-v1", // pre-1.20 layout with a made-up checksum
			wantErr: func(t *testing.T, err error) {
				var ce *CorruptError
				require.ErrorAs(t, err, &ce)
				assert.Equal(t, CorruptError{ActualCS: 4073806608, ExpectedCS: 1}, *ce)
			},
		},
		{
			name: "badjson",
			wantErr: func(t *testing.T, err error) {
				var de *DecodeError
				require.ErrorAs(t, err, &de)
				assert.Equal(t, fixtureDir+"/badjson/"+DeviceManagerKey, de.Path)
				var se *json.SyntaxError
				require.ErrorAs(t, err, &se)
				assert.EqualError(t, err, "decode checkpoint "+de.Path+": unexpected end of JSON input")
				assert.NotErrorIs(t, err, &CorruptError{})
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			store, err := NewManager(fixtureDir + "/" + tc.name)
			require.NoError(t, err)
			d := New(nil, nil)
			err = store.GetCheckpoint(DeviceManagerKey, d)
			if tc.wantErr != nil {
				require.Error(t, err)
				tc.wantErr(t, err)
				return
			}
			require.NoError(t, err)
			entries, registered := d.GetData()
			assert.Equal(t, tc.wantEntries, entries)
			assert.Equal(t, tc.wantRegistered, registered)
			assert.Equal(t, tc.wantChecksum, d.Checksum())
			assert.Equal(t, tc.wantLegacy, d.Legacy())

			want := tc.reencoded
			if want == nil {
				want = readFixture(t, tc.name, DeviceManagerKey)
			}
			got, err := d.MarshalCheckpoint()
			require.NoError(t, err)
			assert.Equal(t, string(want), string(got))
		})
	}
}

// The worked example of the kubelet's format, built from scratch.
func TestWorkedExampleBytes(t *testing.T) {
	resp, err := proto.Marshal(&pluginapi.ContainerAllocateResponse{Envs: map[string]string{"A": "1"}})
	require.NoError(t, err)
	assert.Equal(t, sampleEntries()[0].AllocResp, resp)

	blob, err := New(sampleEntries(), sampleRegistered()).MarshalCheckpoint()
	require.NoError(t, err)
	sum := sha256.Sum256(blob)
	assert.Equal(t, "58d17cafba4c0a3a446935a6017c1358772c2e3524a18db82b25574d80dfe8da", hex.EncodeToString(sum[:]))
	assert.Len(t, blob, 259)
}

// The codec writes exactly what it is given, in that order: sorting is the
// ledger's job. Map keys follow encoding/json (NUMA ids sorted as strings).
func TestMarshalKeepsOrderAndNilness(t *testing.T) {
	entries := []PodDevicesEntry{
		{PodUID: "b", ContainerName: "c", ResourceName: "r", DeviceIDs: DevicesPerNUMA{10: {"z", "a"}, 2: {"m"}, -1: nil}, AllocResp: []byte{}},
		{PodUID: "a", ContainerName: "c", ResourceName: "r"},
	}
	blob, err := New(entries, map[string][]string{"r": {}, "q": nil}).MarshalCheckpoint()
	require.NoError(t, err)
	want := `{"Data":{"PodDeviceEntries":[` +
		`{"PodUID":"b","ContainerName":"c","ResourceName":"r","DeviceIDs":{"-1":null,"10":["z","a"],"2":["m"]},"AllocResp":""},` +
		`{"PodUID":"a","ContainerName":"c","ResourceName":"r","DeviceIDs":null,"AllocResp":null}],` +
		`"RegisteredDevices":{"q":null,"r":[]}},"Checksum":`
	require.Greater(t, len(blob), len(want))
	assert.Equal(t, want, string(blob[:len(want)]))

	var back Data
	require.NoError(t, back.UnmarshalCheckpoint(blob))
	require.NoError(t, back.VerifyChecksum())
	gotEntries, gotRegistered := back.GetData()
	assert.Equal(t, entries, gotEntries)
	assert.Equal(t, map[string][]string{"r": {}, "q": nil}, gotRegistered)
}

func TestUnmarshalErrors(t *testing.T) {
	tests := []struct {
		name, blob string
		wantMsg    string
	}{
		// The messages speak of the file, never of Go's types.
		{"empty input", "", "decode checkpoint: file is empty"},
		{"only white space", " \n", "decode checkpoint: file is empty"},
		{"truncated", `{"Data":{`, "decode checkpoint: unexpected end of JSON input"},
		{"not an object", "[]", "decode checkpoint: not a checkpoint: the document is a JSON array, not an object"},
		{"negative checksum", `{"Data":{},"Checksum":-1}`, "decode checkpoint: not a checkpoint: Checksum cannot hold JSON number -1"},
		{"entries not a list", `{"Data":{"PodDeviceEntries":"x"}}`, "decode checkpoint: not a checkpoint: Data.PodDeviceEntries cannot hold JSON string"},
		{"NUMA key not a number", `{"Data":{"PodDeviceEntries":[{"DeviceIDs":{"x":[]}}]}}`, ""},
		{"trailing data", `{"Data":{}}{}`, "decode checkpoint: invalid character '{' after top-level value"},
		{"device IDs of the wrong type", `{"Data":{"PodDeviceEntries":[{"DeviceIDs":"dev"}]}}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := New(sampleEntries(), sampleRegistered())
			err := d.UnmarshalCheckpoint([]byte(tc.blob))
			var de *DecodeError
			require.ErrorAs(t, err, &de)
			assert.Empty(t, de.Path)
			if tc.wantMsg != "" {
				assert.EqualError(t, err, tc.wantMsg)
			}
			entries, _ := d.GetData()
			assert.Equal(t, sampleEntries(), entries, "a failed decode leaves the content unchanged")
		})
	}
}

func TestUnmarshalReplacesContent(t *testing.T) {
	d := New(sampleEntries(), map[string][]string{"old.com/x": {"1"}})
	require.NoError(t, d.UnmarshalCheckpoint([]byte(`{"Data":{"RegisteredDevices":{"new.com/y":["2"]}},"Checksum":5}`)))
	entries, registered := d.GetData()
	// Absent fields decode as the kubelet's pre-initialised empty values.
	assert.Equal(t, []PodDevicesEntry{}, entries)
	assert.Equal(t, map[string][]string{"new.com/y": {"2"}}, registered)
	assert.Equal(t, uint64(5), d.Checksum())
	assert.Error(t, d.VerifyChecksum())
}

func TestCorruptErrorMatching(t *testing.T) {
	err := error(&CorruptError{ActualCS: 1, ExpectedCS: 2})
	wrapped := errors.Join(errors.New("context"), err)
	assert.ErrorIs(t, wrapped, &CorruptError{})
	assert.ErrorIs(t, wrapped, CorruptError{})
	assert.ErrorIs(t, wrapped, &CorruptError{ActualCS: 7})
	assert.NotErrorIs(t, wrapped, ErrNotFound)
	assert.NotErrorIs(t, errors.New("checkpoint is corrupted"), &CorruptError{})
	var ce *CorruptError
	require.ErrorAs(t, wrapped, &ce)
	assert.Equal(t, uint64(2), ce.ExpectedCS)
}

// The document is what encoding/json writes for the kubelet's wire struct,
// and its checksum is go-spew's, on thousands of arbitrary values.
func TestMarshalIsEncodingJSON(t *testing.T) {
	g := newGen(3, 4)
	for i := range 2000 {
		d := g.data()
		got, err := New(d.PodDeviceEntries, d.RegisteredDevices).MarshalCheckpoint()
		require.NoError(t, err)
		want, err := json.Marshal(wire{Data: d, Checksum: spewChecksum(d)})
		require.NoError(t, err)
		if string(got) != string(want) {
			t.Fatalf("case %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

// A Data given one state after another with SetData writes, for each, the
// very bytes a new Data writes: entries added, removed, replaced, moved,
// repeated and changed in place by the caller, with the registered devices
// changing too.
func TestSetDataWritesWhatNewWrites(t *testing.T) {
	g := newGen(5, 6)
	reused := New(nil, nil)
	var entries []PodDevicesEntry
	for step := range 400 {
		switch op := g.r.IntN(6); {
		case op < 3 || len(entries) == 0: // an admission appends
			entries = append(slices.Clone(entries), g.data().PodDeviceEntries...)
		case op == 3: // a pod goes
			i := g.r.IntN(len(entries))
			entries = slices.Delete(slices.Clone(entries), i, i+1)
		case op == 4: // a record is replaced in place
			entries = slices.Clone(entries)
			e := g.data().PodDeviceEntries
			if len(e) > 0 {
				i := g.r.IntN(len(entries))
				e[0].PodUID, e[0].ContainerName, e[0].ResourceName = entries[i].PodUID, entries[i].ContainerName, entries[i].ResourceName
				entries[i] = e[0]
			}
		default: // the same entries in another order, one of them twice
			entries = slices.Clone(entries)
			g.r.Shuffle(len(entries), func(i, j int) { entries[i], entries[j] = entries[j], entries[i] })
			entries = append(entries, entries[0])
		}
		if g.r.IntN(10) == 0 {
			entries = nil
		}
		if step%7 == 0 && len(entries) > 0 && entries[0].DeviceIDs != nil {
			// The caller changes an entry it gave before, in place.
			entries[0].DeviceIDs[12345] = []string{fmt.Sprint("changed-", step)}
		}
		registered := g.registered()
		reused.SetData(entries, registered)
		got, err := reused.MarshalCheckpoint()
		require.NoError(t, err)
		want, err := New(entries, registered).MarshalCheckpoint()
		require.NoError(t, err)
		if string(got) != string(want) {
			t.Fatalf("step %d:\n got %s\nwant %s", step, got, want)
		}
		require.NoError(t, reused.VerifyChecksum())
		require.LessOrEqual(t, len(reused.encoded), len(entries), "step %d: the cache keeps only the document's entries", step)
	}
}

// FuzzDecodeCheckpoint feeds arbitrary bytes to the decoder: it never panics;
// whatever decodes has the go-spew checksum, re-encodes, and decodes again to
// the same content, which verifies.
func FuzzDecodeCheckpoint(f *testing.F) {
	for _, name := range []string{"sample", "empty", "corrupt", "legacy-v1", "legacy-v1-valid", "badjson", "reformatted"} {
		f.Add(readFixture(f, name, DeviceManagerKey))
	}
	f.Add([]byte(`{"Data":{"PodDeviceEntries":[{"DeviceIDs":{"-1":null,"10":[],"2":["\u0000"]},"AllocResp":""}],"RegisteredDevices":null},"Checksum":0}`))
	f.Fuzz(func(t *testing.T, blob []byte) {
		var d Data
		if err := d.UnmarshalCheckpoint(blob); err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("decode error %v is not a *DecodeError", err)
			}
			return
		}
		if d.Legacy() {
			if got, want := legacyChecksumOf(d.legacy), legacySpewChecksum(d.legacy); got != want {
				t.Fatalf("legacy checksum %d, go-spew %d", got, want)
			}
		} else if got, want := checksumOf(&d.data), spewChecksum(d.data); got != want {
			t.Fatalf("checksum %d, go-spew %d", got, want)
		}
		entries, registered := d.GetData()
		out, err := d.MarshalCheckpoint()
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		var back Data
		if err := back.UnmarshalCheckpoint(out); err != nil {
			t.Fatalf("decode of re-encoded %q: %v", out, err)
		}
		if err := back.VerifyChecksum(); err != nil {
			t.Fatalf("re-encoded checkpoint does not verify: %v", err)
		}
		backEntries, backRegistered := back.GetData()
		require.Equal(t, entries, backEntries)
		require.Equal(t, registered, backRegistered)
		require.Equal(t, d.Legacy(), back.Legacy())
		again, err := back.MarshalCheckpoint()
		require.NoError(t, err)
		require.Equal(t, string(out), string(again))
	})
}
