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
		history := []map[string][]string{d.RegisteredDevices}
		for step := range 30 {
			switch op := r.IntN(9); {
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
				history = append(history, d.RegisteredDevices)
			case op == 7: // ... or come back to an earlier state, in new slices or not
				d.RegisteredDevices = history[r.IntN(len(history))]
				if r.IntN(2) == 0 {
					d.RegisteredDevices = cloneRegistered(d.RegisteredDevices)
				}
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

// cloneRegistered copies m and its ID lists, nil and empty kept apart.
func cloneRegistered(m map[string][]string) map[string][]string {
	if m == nil {
		return nil
	}
	out := make(map[string][]string, len(m))
	for k, v := range m {
		out[k] = slices.Clone(v)
	}
	return out
}

// Registered devices that come back to one of the last two states the
// Encoder wrote, in new slices, are recognised by content: the document
// reuses that state's hash and JSON, and is still exactly the kubelet's,
// also when the entries before changed meanwhile. Lists that differ only
// in nil against empty are different states, and a third state pushes the
// oldest out.
func TestEncoderRecallsEarlierRegisteredDevices(t *testing.T) {
	a := map[string][]string{"r": {"dev-1", "dev-2", "dev-3"}, "s": {"x"}}
	b := map[string][]string{"r": {"dev-1", "dev-3"}, "s": {"x"}}
	c := map[string][]string{"r": {"dev-1"}, "s": {"x"}}
	one := encodeAll(sampleEntries())
	two := append(slices.Clone(one), EncodeEntry(PodDevicesEntry{PodUID: "zzz", ContainerName: "c",
		ResourceName: "r", DeviceIDs: DevicesPerNUMA{0: {"dev-2"}}, AllocResp: []byte{1}}))
	steps := []struct {
		entries    []*EncodedEntry
		registered map[string][]string
		recalled   bool
	}{
		{one, a, false},
		{one, b, false},
		{one, cloneRegistered(a), true},
		{one, cloneRegistered(b), true},
		{two, cloneRegistered(a), true}, // hashed again from the new state
		{nil, cloneRegistered(b), true}, // the text after a nil entry list differs
		{nil, c, false},
		{nil, cloneRegistered(a), false}, // pushed out by b and c
		{nil, map[string][]string{"r": {}}, false},
		{nil, map[string][]string{"r": nil}, false},
		{nil, map[string][]string{"r": {}}, true},
		{nil, map[string][]string{}, false},
		{nil, nil, false},
		{nil, map[string][]string{}, true},
	}
	var enc Encoder
	for i, st := range steps {
		checkEncode(t, &enc, st.entries, st.registered, fmt.Sprintf("step %d", i))
		if got := enc.hit != nil; got != st.recalled {
			t.Fatalf("step %d: recalled %v, want %v", i, got, st.recalled)
		}
	}
}

// Many documents in a row with a nil map of registered devices, or an empty
// one, get a transfer of that text (after tailTransferAfter documents); the
// other one coming next is hashed as what it is, not through that transfer.
func TestEncoderNilAndEmptyRegisteredAfterTransfer(t *testing.T) {
	for _, first := range []map[string][]string{nil, {}} {
		var enc Encoder
		var then map[string][]string
		if first == nil {
			then = map[string][]string{}
		}
		entries := encodeAll(sampleEntries())
		for i := range tailTransferAfter + 40 {
			// The entries change, so that the text after them is hashed
			// from a new state each time.
			entries = append(slices.Clone(entries), EncodeEntry(PodDevicesEntry{PodUID: fmt.Sprintf("u%03d", i)}))
			checkEncode(t, &enc, entries, first, fmt.Sprintf("%v %d", first, i))
		}
		if enc.tailTransfer == nil {
			t.Fatalf("%v: no transfer was built", first)
		}
		checkEncode(t, &enc, entries, then, fmt.Sprintf("%v after %v", then, first))
		checkEncode(t, &enc, entries, first, fmt.Sprintf("%v again", first))
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
