package checkpoint

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// A transfer gives the state plain hashing gives, from any state, for texts
// of every length (the empty one included) and every byte value.
func TestFNVTransferMatchesHashing(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{0, 1, 2, 7, 8, 9, 255, 256, 1900, 5000} {
		text := make([]byte, n)
		for i := range text {
			text[i] = byte(r.Uint32())
		}
		tr := newFNVTransfer(text)
		starts := []uint32{0, 1, 0xff, 0x100, fnvOffset32, 0xffffffff}
		for range 200 {
			starts = append(starts, r.Uint32())
		}
		for _, h := range starts {
			if got, want := tr.apply(h), fnvUpdate(h, text); got != want {
				t.Fatalf("len %d, from %#x: transfer %#x, hashing %#x", n, h, got, want)
			}
		}
	}
}

func FuzzFNVTransfer(f *testing.F) {
	f.Add([]byte("PodUID:(string)pod1"), uint32(fnvOffset32))
	f.Add([]byte{}, uint32(0))
	f.Fuzz(func(t *testing.T, text []byte, h uint32) {
		if got, want := newFNVTransfer(text).apply(h), fnvUpdate(h, text); got != want {
			t.Fatalf("from %#x: transfer %#x, hashing %#x", h, got, want)
		}
	})
}

// withTransfers sets when entries get transfers for the length of a test.
func withTransfers(t *testing.T, after uint32, budget int) {
	t.Helper()
	oldAfter, oldBudget := transferAfter, transferBudget
	transferAfter, transferBudget = after, budget
	t.Cleanup(func() { transferAfter, transferBudget = oldAfter, oldBudget })
}

// Whether entries are hashed through transfers, plainly, or a mix of both
// (a budget too small for all of them), every document and checksum is the
// one a fresh Data writes.
func TestEncoderWithTransfers(t *testing.T) {
	for _, tc := range []struct {
		after  uint32
		budget int
	}{{0, 1 << 30}, {1, 1}, {3, 200}} {
		t.Run(fmt.Sprintf("after=%d,budget=%d", tc.after, tc.budget), func(t *testing.T) {
			withTransfers(t, tc.after, tc.budget)
			g := newGen(21, 22)
			r := rand.New(rand.NewPCG(23, 24))
			withTransfer := 0
			for run := range 50 {
				var c Encoder
				d := g.data()
				enc := encodeAll(d.PodDeviceEntries)
				if enc == nil {
					enc = []*EncodedEntry{}
				}
				for step := range 40 {
					if r.IntN(4) == 0 && len(enc) > 0 {
						i := r.IntN(len(enc))
						enc = append(enc[:i:i], enc[i+1:]...)
					} else {
						e := EncodeEntry(PodDevicesEntry{PodUID: g.str(), ContainerName: g.str(), ResourceName: g.str(),
							DeviceIDs: g.numa(), AllocResp: g.bytes()})
						i := r.IntN(len(enc) + 1)
						enc = append(enc[:i:i], append([]*EncodedEntry{e}, enc[i:]...)...)
					}
					checkEncode(t, &c, enc, d.RegisteredDevices, fmt.Sprintf("run %d step %d", run, step))
				}
				for _, e := range enc {
					if e.transfer.Load() != nil {
						withTransfer++
					}
				}
			}
			if withTransfer == 0 {
				t.Fatal("no entry was hashed through a transfer: the test proves nothing")
			}
		})
	}
}

// With the default settings, a ledger that grows by insertions at random
// places ends with most long-lived entries hashed through transfers, and one
// Encode never computes transfers for much more than its budget.
func TestEncoderTransfersAreEarnedAndBudgeted(t *testing.T) {
	entries, registered := benchData(600)
	r := rand.New(rand.NewPCG(31, 32))
	var c Encoder
	var enc []*EncodedEntry
	for _, e := range entries {
		i := r.IntN(len(enc) + 1)
		enc = append(enc[:i:i], append([]*EncodedEntry{EncodeEntry(e)}, enc[i:]...)...)
		before := countTransfers(enc)
		c.Encode(enc, registered)
		made := countTransfers(enc) - before
		text := appendEntryText(nil, &enc[0].entry)
		if limit := transferBudget/len(text) + 1; made > limit {
			t.Fatalf("one Encode computed %d transfers, budget allows %d", made, limit)
		}
	}
	with := countTransfers(enc)
	if with < len(enc)/2 {
		t.Fatalf("%d of %d entries have a transfer after %d insertions", with, len(enc), len(entries))
	}
	for _, e := range enc {
		if e.transfer.Load() != nil && e.hashed.Load() <= transferAfter {
			t.Fatalf("an entry hashed %d times got a transfer", e.hashed.Load())
		}
	}
}

func countTransfers(enc []*EncodedEntry) (n int) {
	for _, e := range enc {
		if e.transfer.Load() != nil {
			n++
		}
	}
	return n
}

// Transfers compose: the transfer of a, then b's, is the transfer of a+b;
// the identity changes nothing.
func TestFNVTransferThen(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for _, split := range []int{0, 1, 100, 999, 1000} {
		text := make([]byte, 1000)
		for i := range text {
			text[i] = byte(r.Uint32())
		}
		whole := newFNVTransfer(text)
		parts := identityTransfer().then(newFNVTransfer(text[:split])).then(newFNVTransfer(text[split:]))
		if *parts != *whole {
			t.Fatalf("split at %d: composed transfer differs from the whole text's", split)
		}
	}
}

// The text after the entries (the registered devices) gets a transfer too,
// built a slice per document once it has stayed the same long enough; every
// document on the way, and after the devices change, is what a fresh Data
// writes.
func TestEncoderTailTransfer(t *testing.T) {
	withTransfers(t, 2, 64)
	g := newGen(61, 62)
	var c Encoder
	enc := encodeAll([]PodDevicesEntry{{PodUID: "p", ContainerName: "c", ResourceName: "r",
		DeviceIDs: DevicesPerNUMA{0: {"d"}}, AllocResp: []byte{1, 2}}})
	registered := g.registered()
	for len(registered) == 0 {
		registered = g.registered()
	}
	complete := 0
	for step := range 300 {
		if step == 150 {
			registered = map[string][]string{"other.com/x": {"x1", "x2"}}
		}
		checkEncode(t, &c, enc, registered, fmt.Sprintf("step %d", step))
		if step == 149 && c.tailTransfer != nil {
			complete++
		}
		if step == 150 && c.tailTransfer != nil {
			t.Fatal("the tail changed but its old transfer is kept")
		}
	}
	if c.tailTransfer != nil {
		complete++
	}
	if complete != 2 {
		t.Fatalf("tail transfer complete %d times of 2", complete)
	}
}

// The registered devices are "the same" only as the very same slices: equal
// IDs in new slices, nil against empty, one key more or less all count as a
// change, and every document stays what a fresh Data writes.
func TestEncoderRegisteredIdentity(t *testing.T) {
	withTransfers(t, 0, 1<<30)
	ids := []string{"a", "b"}
	cases := []struct {
		name string
		a, b map[string][]string
		same bool
	}{
		{"same slices", map[string][]string{"r": ids}, map[string][]string{"r": ids}, true},
		{"equal IDs, new slice", map[string][]string{"r": ids}, map[string][]string{"r": {"a", "b"}}, false},
		{"shorter view of the same array", map[string][]string{"r": ids}, map[string][]string{"r": ids[:1]}, false},
		{"nil and empty slice", map[string][]string{"r": nil}, map[string][]string{"r": {}}, false},
		{"nil and empty map", nil, map[string][]string{}, false},
		{"one key more", map[string][]string{"r": ids}, map[string][]string{"r": ids, "s": nil}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := sameRegistered(tc.a, tc.b); got != tc.same {
				t.Fatalf("sameRegistered = %v, want %v", got, tc.same)
			}
			var c Encoder
			enc := encodeAll([]PodDevicesEntry{{PodUID: "p", ContainerName: "c", ResourceName: "r"}})
			for step := range 4 {
				checkEncode(t, &c, enc, tc.a, fmt.Sprintf("a, step %d", step))
			}
			checkEncode(t, &c, enc, tc.b, "b")
			checkEncode(t, &c, enc, tc.a, "a again")
		})
	}
}

// Entries prepared ahead of the encoder, some while it encodes them in
// another goroutine, give the documents a fresh Data writes; a prepared
// entry is hashed through its transfer from its first document on.
func TestEncoderWithPreparedEntries(t *testing.T) {
	withTransfers(t, 1<<30, 0) // the encoder itself never builds one
	g := newGen(41, 42)
	r := rand.New(rand.NewPCG(43, 44))
	var c Encoder
	enc := encodeAll(g.data().PodDeviceEntries)
	registered := g.registered()
	prepared := 0
	for step := range 300 {
		e := EncodeEntry(PodDevicesEntry{PodUID: g.str(), ContainerName: g.str(), ResourceName: g.str(),
			DeviceIDs: g.numa(), AllocResp: g.bytes()})
		if e.Prepared() {
			t.Fatal("a new entry claims a transfer")
		}
		i := r.IntN(len(enc) + 1)
		enc = append(enc[:i:i], append([]*EncodedEntry{e}, enc[i:]...)...)
		switch r.IntN(3) {
		case 0: // left to the encoder
			checkEncode(t, &c, enc, registered, fmt.Sprintf("step %d", step))
		case 1: // prepared before the encode
			e.Prepare()
			prepared++
			if !e.Prepared() {
				t.Fatal("Prepare left no transfer")
			}
			checkEncode(t, &c, enc, registered, fmt.Sprintf("step %d, prepared", step))
		case 2: // prepared while the encoder runs
			done := make(chan struct{})
			go func() {
				defer close(done)
				e.Prepare()
			}()
			checkEncode(t, &c, enc, registered, fmt.Sprintf("step %d, prepared meanwhile", step))
			<-done
			prepared++
		}
	}
	if prepared == 0 || countTransfers(enc) != prepared {
		t.Fatalf("%d entries have a transfer, %d were prepared", countTransfers(enc), prepared)
	}
	// The documents after the last step still hash every prepared entry
	// through its transfer: the encoder's own plain-hash count never moved.
	for _, e := range enc {
		if e.Prepared() && e.hashed.Load() > 1 {
			t.Fatalf("a prepared entry was hashed plainly %d times", e.hashed.Load())
		}
	}
}
