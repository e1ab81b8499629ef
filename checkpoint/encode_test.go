package checkpoint

import (
	"encoding/json"
	"strings"
	"testing"
)

// stdJSON is the kubelet's encoding: encoding/json of its structs.
func stdJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestEncodeMatchesEncodingJSONOnFixtures(t *testing.T) {
	for _, name := range []string{"sample", "empty", "legacy-v1-valid"} {
		t.Run(name, func(t *testing.T) {
			blob := readFixture(t, name, DeviceManagerKey)
			var d Data
			if err := d.UnmarshalCheckpoint(blob); err != nil {
				t.Fatal(err)
			}
			var got []byte
			if d.legacy != nil {
				got = encodeLegacyJSON(d.legacy, d.checksum)
			} else {
				got = encodeJSON(&d.data, d.checksum)
			}
			if string(got) != string(blob) {
				t.Fatalf("encoded\n%s\nwant\n%s", got, blob)
			}
		})
	}
}

// Every escaping rule of encoding/json: quotes, backslash, the short control
// escapes, other control bytes, HTML characters, invalid UTF-8, U+2028/9.
func TestEncodeStringEscapes(t *testing.T) {
	for _, s := range []string{
		"", "plain", `q"uote`, `back\slash`, "\b\f\n\r\t", "\x00\x01\x1f\x7f", "<a href=\"x\">&amp;</a>",
		"\xff", "a\xc3", "\xe2\x80\xa8 \xe2\x80\xa9", "é✓𝄞", "\xed\xa0\x80", "mixed\x00é\xffz",
	} {
		want := stdJSON(t, s)
		if got := string(appendString(nil, s)); got != want {
			t.Errorf("%q: got %s, encoding/json %s", s, got, want)
		}
	}
}

func TestEncodeMatchesEncodingJSONOnRandomData(t *testing.T) {
	g := newGen(3, 4)
	for i := range 3000 {
		d := g.data()
		if got, want := string(encodeJSON(&d, uint64(i)<<20)), stdJSON(t, wire{Data: d, Checksum: uint64(i) << 20}); got != want {
			t.Fatalf("case %d:\n got %s\nwant %s", i, got, want)
		}
		ld := g.legacy()
		if got, want := string(encodeLegacyJSON(&ld, uint64(i))), stdJSON(t, legacyWire{Data: ld, Checksum: uint64(i)}); got != want {
			t.Fatalf("legacy case %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

// FuzzEncodeMatchesEncodingJSON lets the fuzzer pick every string (invalid
// UTF-8 included), NUMA key and byte; the hand-written encoder must write
// exactly what encoding/json writes.
func FuzzEncodeMatchesEncodingJSON(f *testing.F) {
	f.Add("pod-uid-1", "ctr", "example.com/dev", int64(0), "dev-0,dev-1", []byte{10, 6}, "example.com/dev", uint64(648430460))
	f.Add("<&>", "\u2028", "\xff\xfe", int64(-1), ",,", []byte(nil), "", uint64(0))
	f.Fuzz(func(t *testing.T, pod, ctr, res string, numa int64, ids string, resp []byte, regKey string, checksum uint64) {
		list := strings.Split(ids, ",")
		d := checkpointData{
			PodDeviceEntries: []PodDevicesEntry{
				{PodUID: pod, ContainerName: ctr, ResourceName: res, DeviceIDs: DevicesPerNUMA{numa: list, numa / 3: nil}, AllocResp: resp},
				{PodUID: ids, ContainerName: regKey, DeviceIDs: DevicesPerNUMA{}, AllocResp: []byte{}},
			},
			RegisteredDevices: map[string][]string{regKey: list, pod: {}, res: nil},
		}
		if got, want := string(encodeJSON(&d, checksum)), stdJSON(t, wire{Data: d, Checksum: checksum}); got != want {
			t.Fatalf("\n got %s\nwant %s", got, want)
		}
		ld := legacyCheckpointData{PodDeviceEntries: []legacyEntry{{PodUID: pod, ContainerName: ctr, ResourceName: res, DeviceIDs: list, AllocResp: resp}}}
		if got, want := string(encodeLegacyJSON(&ld, checksum)), stdJSON(t, legacyWire{Data: ld, Checksum: checksum}); got != want {
			t.Fatalf("legacy\n got %s\nwant %s", got, want)
		}
	})
}
