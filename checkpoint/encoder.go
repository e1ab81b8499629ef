package checkpoint

import (
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"
)

// EncodedEntry is an allocation record with its JSON object, computed once,
// the first time a checkpoint is encoded with the entry (so restoring a
// ledger from a file costs no encoding); the entry never changes. A ledger
// that keeps one per record lets an Encoder write a checkpoint without
// encoding unchanged records again. The text the checksum hashes is not
// kept: it is twice the size of the JSON, and an entry hashed often gets a
// transfer instead (see fnvTransfer), so the text is written out again, into
// the Encoder's buffer, only the few times it is hashed plainly. Safe for
// concurrent use.
type EncodedEntry struct {
	entry PodDevicesEntry
	once  sync.Once
	json  []byte

	// hashed counts the plain passes Encoders made over the entry's text;
	// past transferAfter, the entry is given a transfer and hashed
	// through it.
	hashed   atomic.Uint32
	transfer atomic.Pointer[fnvTransfer]
}

// transferAfter is how many plain passes over an entry's text come before
// its transfer is computed: one, the pass that adds the entry, so that an
// entry the ledger appends and never hashes again costs no transfer. A
// transfer costs about 40 passes; waiting for 32 would keep the total work
// within twice the best choice made in hindsight, but pod UIDs are random,
// so an admission lands anywhere in the sorted ledger and an entry is
// hashed again on nearly every admission before it. Waiting then makes
// the recent entries, still without a transfer, a cost that grows with
// the ledger: on 1,000 sequential admissions (bench W2, three runs each,
// medians) the last 100 took 1.39 ms with 32 and 1.24 ms with 1, the first
// 100 0.96 and 1.01 ms; two admitting goroutines (W5) went from 1,407 to
// 1,565 pods/s.
var transferAfter uint32 = 1

// tailTransferAfter is how many documents in a row must have the same text
// after the entries (the registered devices, which change on device
// updates) before its transfer is built.
const tailTransferAfter = 32

// transferBudget bounds the text, in bytes, for which one Encode computes
// transfers (one more is allowed to start under it), so that a ledger
// restored with many entries spreads the work over many admissions instead
// of stalling one.
var transferBudget = 4096

// hashFrom returns the state after e's text from state h, computing e's
// transfer when it has earned one and budget (bytes) allows. buf is scratch
// space for the text; the grown buffer is returned.
func (e *EncodedEntry) hashFrom(h uint32, buf []byte, budget *int) (uint32, []byte) {
	if t := e.transfer.Load(); t != nil {
		return t.apply(h), buf
	}
	text := appendEntryText(buf[:0], &e.entry)
	if e.hashed.Add(1) > transferAfter && *budget > 0 {
		*budget -= len(text)
		t := newFNVTransfer(text)
		e.transfer.Store(t)
		return t.apply(h), text
	}
	return fnvUpdate(h, text), text
}

// Prepare does now, in the caller's goroutine, what an Encoder would do for
// e on its next documents: the JSON, and the transfer that makes hashing
// the entry again cost a table lookup instead of a pass over its text.
// Admissions that overlap each other call it before they queue for the
// write they share, so that the writer does not build each new record's
// transfer in turn while the others wait. Safe for concurrent use, also
// with Encoders using e.
func (e *EncodedEntry) Prepare() {
	e.encoded()
	if e.transfer.Load() == nil {
		e.transfer.CompareAndSwap(nil, newFNVTransfer(appendEntryText(nil, &e.entry)))
	}
}

// Prepared reports whether e has its transfer: whether hashing it again
// costs a table lookup rather than a pass over its text.
func (e *EncodedEntry) Prepared() bool { return e.transfer.Load() != nil }

// EncodeEntry wraps e. e's maps and slices are kept, not copied: they must
// not be modified afterwards.
func EncodeEntry(e PodDevicesEntry) *EncodedEntry { return &EncodedEntry{entry: e} }

// Entry returns the record.
func (e *EncodedEntry) Entry() PodDevicesEntry { return e.entry }

// encoded returns the JSON object, computing it once.
func (e *EncodedEntry) encoded() []byte {
	e.once.Do(func() {
		json := appendEntryHead(nil, e.entry.PodUID, e.entry.ContainerName, e.entry.ResourceName)
		json = appendNUMA(json, e.entry.DeviceIDs)
		e.json = appendEntryTail(json, e.entry.AllocResp)
	})
	return e.json
}

// Encoder writes checkpoint documents from encoded entries, byte for byte
// what New(entries, registered).MarshalCheckpoint writes, and remembers the
// last document: the next one is hashed and assembled only from the first
// entry that differs (compared by identity), the rest being reused. A ledger
// that appends new records at the end pays for the new record and the
// registered devices only. An insertion in the middle must hash the entries
// after it again, from the new state; an entry hashed that way often enough
// gets a transfer (see fnvTransfer), after which it costs a few nanoseconds
// instead of a pass over its text, so that admissions stay flat as the
// ledger grows.
//
// The FNV-1a state after each entry is what makes this possible: the
// kubelet's checksum is a hash over the whole text, so a change can only be
// hashed from the state just before it.
//
// An Encoder is not safe for concurrent use.
type Encoder struct {
	prev    []*EncodedEntry
	prevNil bool
	// states[i] is the hash state before entry i (before its separator);
	// states[len(prev)] the state after the last one.
	states []uint32
	// offsets[i] is where entry i (with its separating comma) starts in
	// blob; offsets[len(prev)] where the entries end.
	offsets []int
	blob    []byte
	// spare is the buffer of the document before blob, reused for the next
	// one: an admission-heavy node writes a megabyte-sized document per
	// admission, and allocating each anew costs garbage collection.
	spare []byte
	valid bool

	// The text after the entries is the registered devices, which change
	// far less often than entries. prevReg and prevTailNil tell whether it
	// is the same as last time (when tailValid); tailSame counts the
	// documents in a row that had it. Past tailTransferAfter, a transfer of
	// it is built a slice at a time (tailDone bytes so far, in tailPart),
	// and tailTransfer hashes it once complete. Until then the text is
	// written out again for each document, into tailBuf (40 bytes per
	// device, megabytes for the plugins that advertise 100,000 IDs), which
	// is dropped once the transfer is complete.
	prevReg      map[string][]string
	prevTailNil  bool
	tailValid    bool
	tailSame     uint32
	tailDone     int
	tailPart     *fnvTransfer
	tailTransfer *fnvTransfer
	tailBuf      []byte
	// blob[regStart:regEnd] is the JSON of the registered devices (a nil
	// map when regNil), copied into the next document while they stay the
	// same: with 80,000 IDs it is megabytes, and escaping each ID again
	// cost an admission 1.6 ms.
	regStart, regEnd int
	regNil           bool

	// recent remembers the registered devices of the last two documents
	// whose registered devices differed from the document's before, newest
	// first, so that devices coming back to an earlier state (a device's
	// health flapping to unhealthy and back) cost neither a hash of the
	// text nor writing out the JSON again. Compared by content.
	recent [2]*tailMemo
	// hit is the memo of this Encode's registered devices, when recent has
	// them.
	hit *tailMemo

	// text is scratch space for an entry's hashed text.
	text []byte
}

// A tailMemo is the registered devices of an earlier document: the text
// after the entries hashes from state from (isNil: after a nil entry list)
// to state to, and json is their JSON (nil when larger than
// memoJSONLimit).
type tailMemo struct {
	reg      map[string][]string
	regNil   bool
	isNil    bool
	from, to uint32
	json     []byte
}

// memoJSONLimit bounds the JSON a tailMemo keeps: two of them hold about
// 100,000 device IDs.
const memoJSONLimit = 4 << 20

// recall returns the memo of registered (by content) and moves it first;
// nil if recent does not have it.
func (c *Encoder) recall(registered map[string][]string) *tailMemo {
	for i, m := range c.recent {
		if m != nil && m.regNil == (registered == nil) && sameContent(registered, m.reg) {
			c.recent[0], c.recent[i] = m, c.recent[0]
			return m
		}
	}
	return nil
}

// memorize records the registered devices of the document just encoded,
// whose text hashed from state from to state to, and whose JSON is json.
// The memo it evicts lends its JSON buffer.
func (c *Encoder) memorize(registered map[string][]string, isNil bool, from, to uint32, json []byte) {
	m := c.recent[1]
	if m == nil {
		m = &tailMemo{}
	}
	buf := m.json[:0]
	*m = tailMemo{reg: c.prevReg, regNil: registered == nil, isNil: isNil, from: from, to: to}
	if len(json) <= memoJSONLimit {
		m.json = append(buf, json...)
	}
	c.recent[0], c.recent[1] = m, c.recent[0]
}

// sameContent reports whether a and b hold the same keys and, for each, the
// same IDs in the same order, nil and empty lists told apart.
func sameContent(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || (v == nil) != (w == nil) || len(v) != len(w) {
			return false
		}
		// The same slice again (a resource handing back a list it kept)
		// is equal without a look at its IDs.
		if unsafe.SliceData(v) != unsafe.SliceData(w) && !slices.Equal(v, w) {
			return false
		}
	}
	return true
}

// hashTail returns the checksum: state h continued over the text after the
// entries. same reports that registered is the previous document's.
func (c *Encoder) hashTail(h uint32, isNil bool, registered map[string][]string) (sum uint32, same bool) {
	same = c.tailValid && isNil == c.prevTailNil && sameRegistered(registered, c.prevReg)
	c.hit = nil
	if same {
		c.tailSame++
	} else {
		c.prevReg, c.prevTailNil, c.tailValid = maps.Clone(registered), isNil, true
		c.tailSame, c.tailDone, c.tailPart, c.tailTransfer = 0, 0, nil, nil
		if c.hit = c.recall(registered); c.hit != nil {
			if c.hit.isNil != isNil || c.hit.from != h {
				c.hit.isNil, c.hit.from, c.hit.to = isNil, h, hashTailText(h, isNil, registered)
			}
			return c.hit.to, same
		}
	}
	if c.tailTransfer != nil {
		return c.tailTransfer.apply(h), same
	}
	if c.tailSame <= tailTransferAfter {
		// No transfer is being built: hash the text where it lies.
		return hashTailText(h, isNil, registered), same
	}
	if cap(c.tailBuf) == 0 {
		c.tailBuf = make([]byte, 0, 64+sizeHint(registered))
	}
	tail := appendTailText(c.tailBuf[:0], isNil, registered)
	c.tailBuf = tail
	// Each document builds a slice of about 1/32 of the tail (at least the
	// budget), so that no single admission pays for all of it.
	n := max(transferBudget, len(tail)/32)
	end := min(c.tailDone+n, len(tail))
	if c.tailPart == nil {
		c.tailPart = identityTransfer()
	}
	c.tailPart = c.tailPart.then(newFNVTransfer(tail[c.tailDone:end]))
	c.tailDone = end
	if end == len(tail) {
		c.tailTransfer, c.tailPart, c.tailBuf = c.tailPart, nil, nil
		return c.tailTransfer.apply(h), same
	}
	return fnvUpdate(h, tail), same
}

// hashTailText continues h over the text appendTailText writes, reading the
// names and IDs where they are instead of copying them out first.
func hashTailText(h uint32, isNil bool, registered map[string][]string) uint32 {
	if !isNil {
		h = fnvByte(h, ']')
	}
	h = fnvString(h, docRegistered)
	if registered == nil {
		return fnvByte(fnvString(h, spewNil), '}')
	}
	keys := slices.Sorted(maps.Keys(registered))
	h = fnvString(h, "map[")
	for i, k := range keys {
		if i > 0 {
			h = fnvByte(h, ' ')
		}
		h = fnvByte(fnvString(h, k), ':')
		ids := registered[k]
		if ids == nil {
			h = fnvString(h, spewNil)
			continue
		}
		h = fnvByte(h, '[')
		for j, id := range ids {
			if j > 0 {
				h = fnvByte(h, ' ')
			}
			h = fnvString(h, id)
		}
		h = fnvByte(h, ']')
	}
	return fnvByte(fnvByte(h, ']'), '}')
}

// appendTailText appends the hashed text after the entries.
func appendTailText(b []byte, isNil bool, registered map[string][]string) []byte {
	if !isNil {
		b = append(b, ']')
	}
	b = append(b, docRegistered...)
	b = appendRegisteredText(b, registered)
	return append(b, '}')
}

// sameRegistered reports whether a has the keys of b and, for each, the very
// same slice (array and length), nil and empty told apart; a nil map is
// only the same as another nil map (its text differs from an empty one's).
func sameRegistered(a, b map[string][]string) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || len(v) != len(w) || unsafe.SliceData(v) != unsafe.SliceData(w) {
			return false
		}
	}
	return true
}

// Encode returns the checkpoint document of entries (in the order given; nil
// and empty differ, as in New) and registered, and its checksum. The
// document is the caller's until the second Encode after this one, which
// writes over its memory.
//
// The Encoder keeps registered's slices (not the map): they must not be
// modified afterwards. They are compared with the previous call's by
// identity first (the same slice again costs nothing), and with those of
// the last two changes by content.
func (c *Encoder) Encode(entries []*EncodedEntry, registered map[string][]string) ([]byte, uint64) {
	isNil := entries == nil
	k := 0
	if c.valid && isNil == c.prevNil {
		for k < len(entries) && k < len(c.prev) && entries[k] == c.prev[k] {
			k++
		}
	}
	if !c.valid || isNil != c.prevNil {
		k = 0
		c.states = c.states[:0]
		c.offsets = c.offsets[:0]
	} else {
		c.states = c.states[:k+1]
		c.offsets = c.offsets[:k+1]
	}

	// The text: state before entry k, then the entries from k on.
	var h uint32
	if len(c.states) == 0 {
		h = fnvUpdate(fnvOffset32, []byte(docHead))
		if isNil {
			h = fnvUpdate(h, []byte(spewNil))
		} else {
			h = fnvUpdate(h, []byte{'['})
		}
		c.states = append(c.states, h)
	} else {
		h = c.states[k]
	}
	budget := transferBudget
	for i := k; i < len(entries); i++ {
		if i > 0 {
			h = (h ^ ' ') * fnvPrime32
		}
		h, c.text = entries[i].hashFrom(h, c.text, &budget)
		c.states = append(c.states, h)
	}
	sum32, tailSame := c.hashTail(h, isNil, registered)
	sum := uint64(sum32)

	// The JSON: the bytes of the unchanged entries, then the rest.
	size := 0
	for i := k; i < len(entries); i++ {
		json := entries[i].encoded()
		size += len(json) + 1
	}
	copyReg := tailSame && c.valid && (registered == nil) == c.regNil
	regSize := c.regEnd - c.regStart
	switch {
	case copyReg:
	case c.hit != nil && c.hit.json != nil:
		regSize = len(c.hit.json)
	default:
		regSize = sizeHint(registered)
	}
	need := 64 + size + regSize
	var blob []byte
	if len(c.offsets) == 0 {
		blob = c.reuse(need)
		blob = append(blob, `{"Data":{"PodDeviceEntries":`...)
		if isNil {
			blob = append(blob, "null"...)
		} else {
			blob = append(blob, '[')
		}
		c.offsets = append(c.offsets, len(blob))
	} else {
		start := c.offsets[k]
		blob = append(c.reuse(start+need), c.blob[:start]...)
	}
	for i := k; i < len(entries); i++ {
		if i > 0 {
			blob = append(blob, ',')
		}
		json := entries[i].encoded()
		blob = append(blob, json...)
		c.offsets = append(c.offsets, len(blob))
	}
	if !isNil {
		blob = append(blob, ']')
	}
	blob = append(blob, `,"RegisteredDevices":`...)
	regStart := len(blob)
	switch {
	case copyReg:
		blob = append(blob, c.blob[c.regStart:c.regEnd]...)
	case c.hit != nil && c.hit.json != nil:
		blob = append(blob, c.hit.json...)
	default:
		blob = appendRegistered(blob, registered)
		if !tailSame && c.hit == nil {
			c.memorize(registered, isNil, h, sum32, blob[regStart:])
		}
	}
	c.regStart, c.regEnd, c.regNil = regStart, len(blob), registered == nil
	blob = append(blob, `},"Checksum":`...)
	blob = strconv.AppendUint(blob, sum, 10)
	blob = append(blob, '}')

	c.prev = append(c.prev[:0], entries...)
	c.prevNil = isNil
	c.spare, c.blob = c.blob, blob
	c.valid = true
	return blob, sum
}

// reuse returns the spare buffer, empty, if it can hold n bytes, else a new
// one.
func (c *Encoder) reuse(n int) []byte {
	if cap(c.spare) >= n {
		return c.spare[:0]
	}
	return make([]byte, 0, n+n/4)
}
