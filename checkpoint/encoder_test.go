package checkpoint

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func encodeAll(entries []PodDevicesEntry) []*EncodedEntry {
	if entries == nil {
		return nil
	}
	out := make([]*EncodedEntry, len(entries))
	for i, e := range entries {
		out[i] = EncodeEntry(e)
	}
	return out
}

func entriesOf(enc []*EncodedEntry) []PodDevicesEntry {
	if enc == nil {
		return nil
	}
	out := make([]PodDevicesEntry, len(enc))
	for i, e := range enc {
		out[i] = e.Entry()
	}
	return out
}

// checkEncode compares one Encode with a fresh Data's MarshalCheckpoint.
func checkEncode(t *testing.T, c *Encoder, enc []*EncodedEntry, registered map[string][]string, what string) {
	t.Helper()
	got, sum := c.Encode(enc, registered)
	d := New(entriesOf(enc), registered)
	want, err := d.MarshalCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) || sum != d.Checksum() {
		t.Fatalf("%s:\n got %s (%d)\nwant %s (%d)", what, got, sum, want, d.Checksum())
	}
}

// An Encoder reused across any sequence of edits writes exactly what a fresh
// Data writes, for each document.
func TestEncoderMatchesMarshalCheckpoint(t *testing.T) {
	g := newGen(5, 6)
	r := rand.New(rand.NewPCG(7, 8))
	for run := range 200 {
		var c Encoder
		d := g.data()
		enc := encodeAll(d.PodDeviceEntries)
		for step := range 30 {
			switch op := r.IntN(8); {
			case op < 3 && enc != nil: // insert somewhere
				e := EncodeEntry(PodDevicesEntry{PodUID: g.str(), ContainerName: g.str(), ResourceName: g.str(),
					DeviceIDs: g.numa(), AllocResp: g.bytes()})
				i := r.IntN(len(enc) + 1)
				enc = append(enc[:i:i], append([]*EncodedEntry{e}, enc[i:]...)...)
			case op == 3 && len(enc) > 0: // delete
				i := r.IntN(len(enc))
				enc = append(enc[:i:i], enc[i+1:]...)
			case op == 4 && len(enc) > 0: // replace
				i := r.IntN(len(enc))
				enc = append([]*EncodedEntry(nil), enc...)
				enc[i] = EncodeEntry(PodDevicesEntry{PodUID: g.str(), DeviceIDs: g.numa(), AllocResp: g.bytes()})
			case op == 5: // registered devices change
				d.RegisteredDevices = g.registered()
			case op == 6: // nil <-> empty
				if enc == nil {
					enc = []*EncodedEntry{}
				} else if len(enc) == 0 {
					enc = nil
				}
			}
			checkEncode(t, &c, enc, d.RegisteredDevices, fmt.Sprintf("run %d step %d", run, step))
		}
	}
}

func TestEncoderKubeletSample(t *testing.T) {
	var c Encoder
	enc := encodeAll(sampleEntries())
	got, sum := c.Encode(enc, sampleRegistered())
	if string(got) != string(readFixture(t, "sample", DeviceManagerKey)) || sum != 648430460 {
		t.Fatalf("got %s (%d)", got, sum)
	}
	if got, _ := c.Encode(nil, map[string][]string{}); string(got) != string(readFixture(t, "empty", DeviceManagerKey)) {
		t.Fatalf("empty: %s", got)
	}
}

// BenchmarkEncoderAppend is a ledger's admission: one entry more, at the end,
// on 1,000; BenchmarkEncoderInsertMiddle puts it in the middle.
func BenchmarkEncoderAppend(b *testing.B) { benchEncoder(b, func(n int) int { return n }) }

func BenchmarkEncoderInsertMiddle(b *testing.B) { benchEncoder(b, func(n int) int { return n / 2 }) }

// BenchmarkEncoderAppendManyDevices is BenchmarkEncoderAppend on a node
// whose plugin advertises 80,000 device IDs (shared GPUs): the registered
// devices are most of the document and stay the same from one admission to
// the next.
func BenchmarkEncoderAppendManyDevices(b *testing.B) {
	entries, _ := benchData(1000)
	ids := make([]string, 80000)
	for i := range ids {
		ids[i] = fmt.Sprintf("GPU-%08x-1b2d-4e5f-8a9b-%012d", i/8, i)
	}
	benchEncoderOn(b, entries, map[string][]string{"example.com/gpu": ids}, func(n int) int { return n })
}

func benchEncoder(b *testing.B, at func(n int) int) {
	entries, registered := benchData(1000)
	benchEncoderOn(b, entries, registered, at)
}

func benchEncoderOn(b *testing.B, entries []PodDevicesEntry, registered map[string][]string, at func(n int) int) {
	enc := encodeAll(entries)
	extra := EncodeEntry(entries[0])
	var c Encoder
	c.Encode(enc, registered)
	with := append(append(append([]*EncodedEntry(nil), enc[:at(len(enc))]...), extra), enc[at(len(enc)):]...)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			c.Encode(with, registered)
		} else {
			c.Encode(enc, registered)
		}
	}
}

// BenchmarkEncoderGrowRandom is a node admitting 1,000 pods one after the
// other: each lands at a random place in the sorted ledger and is encoded
// into a new document. One op is the whole sequence. resp is the size of
// each plugin response: 28 bytes is a bare environment variable, 560 about
// what a plugin with mounts, devices and a CDI name returns.
func BenchmarkEncoderGrowRandom(b *testing.B) {
	for _, size := range []int{28, 560} {
		b.Run(fmt.Sprintf("resp=%dB", size), func(b *testing.B) {
			entries, registered := benchData(1000)
			resp := make([]byte, size)
			for i := range resp {
				resp[i] = byte(i*37 + 11)
			}
			r := rand.New(rand.NewPCG(41, 42))
			at := make([]int, len(entries))
			for i := range entries {
				entries[i].AllocResp = resp
				at[i] = r.IntN(i + 1)
			}
			b.ReportAllocs()
			for b.Loop() {
				var c Encoder
				enc := make([]*EncodedEntry, 0, len(entries))
				for i, e := range entries {
					enc = slices.Insert(enc, at[i], EncodeEntry(e))
					c.Encode(enc, registered)
				}
			}
		})
	}
}

// hashTailText hashes exactly the text appendTailText writes: nil and empty
// maps and ID lists, several resources, with and without entries before.
func TestHashTailTextMatchesText(t *testing.T) {
	g := newGen(11, 12)
	cases := []map[string][]string{nil, {}, {"r": nil}, {"r": {}}, {"b": {"x", "y"}, "a": nil, "c": {"z"}}}
	for range 200 {
		cases = append(cases, g.registered())
	}
	for i, reg := range cases {
		for _, isNil := range []bool{false, true} {
			for _, h := range []uint32{fnvOffset32, 0, 0xdeadbeef} {
				want := fnvUpdate(h, appendTailText(nil, isNil, reg))
				if got := hashTailText(h, isNil, reg); got != want {
					t.Fatalf("case %d (%v, nil entries %v, h %x): %x, want %x", i, reg, isNil, h, got, want)
				}
			}
		}
	}
}
