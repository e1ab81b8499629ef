package checkpoint

import (
	"encoding/json"
	"reflect"
	"testing"
)

// stdDecode is the reference: encoding/json into the kubelet's structs,
// pre-initialised as the kubelet's manager does.
func stdDecode(blob []byte) (wire, error) {
	w := wire{Data: checkpointData{PodDeviceEntries: []PodDevicesEntry{}, RegisteredDevices: map[string][]string{}}}
	err := json.Unmarshal(blob, &w)
	return w, err
}

// Every document the encoder writes takes the fast path, and decodes to what
// encoding/json decodes.
func TestDecodeCanonicalOnEncodedDocuments(t *testing.T) {
	g := newGen(9, 10)
	for i := range 3000 {
		d := g.data()
		blob := encodeJSON(&d, uint64(i)*7919)
		got, ok := decodeCanonical(blob)
		if !ok {
			t.Fatalf("case %d: the fast path refused a document the encoder wrote:\n%s", i, blob)
		}
		want, err := stdDecode(blob)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("case %d:\n got %#v\nwant %#v", i, got, want)
		}
	}
	for _, name := range []string{"sample", "empty", "corrupt"} {
		blob := readFixture(t, name, DeviceManagerKey)
		if _, ok := decodeCanonical(blob); !ok {
			t.Errorf("%s: the kubelet's own file takes the slow path", name)
		}
	}
	for _, name := range []string{"reformatted", "legacy-v1", "legacy-v1-valid", "badjson"} {
		if _, ok := decodeCanonical(readFixture(t, name, DeviceManagerKey)); ok {
			t.Errorf("%s: not canonical, yet the fast path took it", name)
		}
	}
}

// FuzzDecodeCanonical: whatever the fast path accepts, encoding/json decodes
// to the same value.
func FuzzDecodeCanonical(f *testing.F) {
	for _, name := range []string{"sample", "empty", "reformatted", "legacy-v1-valid"} {
		f.Add(readFixture(f, name, DeviceManagerKey))
	}
	f.Add([]byte(`{"Data":{"PodDeviceEntries":[{"PodUID":"a\u0000\ud83d\ude00\"","ContainerName":"","ResourceName":"r","DeviceIDs":{"-1":null,"10":[],"2":["\u003c"]},"AllocResp":""}],"RegisteredDevices":{"r":null}},"Checksum":0}`))
	f.Fuzz(func(t *testing.T, blob []byte) {
		got, ok := decodeCanonical(blob)
		if !ok {
			return
		}
		want, err := stdDecode(blob)
		if err != nil {
			t.Fatalf("fast path accepted what encoding/json refuses (%v): %q", err, blob)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\n got %#v\nwant %#v", blob, got, want)
		}
	})
}
