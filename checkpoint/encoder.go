package checkpoint

import (
	"strconv"
	"sync"
	"sync/atomic"
)

// EncodedEntry is an allocation record with its two encodings: the JSON
// object of the file and the text the checksum hashes. They are computed
// once, the first time a checkpoint is encoded with the entry (so restoring a
// ledger from a file costs no encoding), and the entry never changes; a
// ledger that keeps one per record lets an Encoder write a checkpoint without
// encoding unchanged records again. Safe for concurrent use.
type EncodedEntry struct {
	entry PodDevicesEntry
	once  sync.Once
	json  []byte
	text  []byte

	// hashed counts the passes Encoders made over text; past
	// transferAfter, the entry is given a transfer and hashed through it.
	hashed   atomic.Uint32
	transfer atomic.Pointer[fnvTransfer]
}

// transferAfter is how many plain passes over an entry's text come before
// its transfer is computed. A transfer costs about 40 passes, so waiting
// for 32 keeps the work within twice the best choice made in hindsight for
// an entry hashed any number of times, and ledgers of a few dozen pods,
// where few entries are hashed that often, rarely pay for one.
var transferAfter uint32 = 32

// transferBudget bounds the text, in bytes, for which one Encode computes
// transfers (one more is allowed to start under it), so that a ledger
// restored with many entries spreads the work over many admissions instead
// of stalling one.
var transferBudget = 4096

// hashFrom returns the state after e's text from state h, computing e's
// transfer when it has earned one and budget (bytes) allows.
func (e *EncodedEntry) hashFrom(h uint32, text []byte, budget *int) uint32 {
	if t := e.transfer.Load(); t != nil {
		return t.apply(h)
	}
	if e.hashed.Add(1) > transferAfter && *budget > 0 {
		*budget -= len(text)
		t := newFNVTransfer(text)
		e.transfer.Store(t)
		return t.apply(h)
	}
	return fnvUpdate(h, text)
}

// EncodeEntry wraps e. e's maps and slices are kept, not copied: they must
// not be modified afterwards.
func EncodeEntry(e PodDevicesEntry) *EncodedEntry { return &EncodedEntry{entry: e} }

// Entry returns the record.
func (e *EncodedEntry) Entry() PodDevicesEntry { return e.entry }

// encoded returns the JSON object and the hashed text, computing them once.
func (e *EncodedEntry) encoded() (json, text []byte) {
	e.once.Do(func() {
		json := appendEntryHead(nil, e.entry.PodUID, e.entry.ContainerName, e.entry.ResourceName)
		json = appendNUMA(json, e.entry.DeviceIDs)
		e.json = appendEntryTail(json, e.entry.AllocResp)
		e.text = appendEntryText(nil, &e.entry)
	})
	return e.json, e.text
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

	// tail is the text after the entries in the last document (the
	// registered devices, which change far less often than entries), and
	// tailScratch the buffer the next one is built in. tailSame counts the
	// documents in a row that had this tail; once it passes transferAfter,
	// a transfer of the tail is built a slice at a time (tailDone bytes
	// so far, in tailPart), and tailTransfer hashes it when complete.
	tail, tailScratch []byte
	tailSame          uint32
	tailDone          int
	tailPart          *fnvTransfer
	tailTransfer      *fnvTransfer
}

// hashTail returns the checksum: state h continued over the text after the
// entries.
func (c *Encoder) hashTail(h uint32, isNil bool, registered map[string][]string) uint32 {
	t := c.tailScratch[:0]
	if !isNil {
		t = append(t, ']')
	}
	t = append(t, docRegistered...)
	t = appendRegisteredText(t, registered)
	t = append(t, '}')
	if c.tail != nil && string(t) == string(c.tail) {
		c.tailScratch = t
		c.tailSame++
	} else {
		c.tail, c.tailScratch = t, c.tail
		c.tailSame, c.tailDone, c.tailPart, c.tailTransfer = 0, 0, nil, nil
	}
	if c.tailTransfer != nil {
		return c.tailTransfer.apply(h)
	}
	if c.tailSame > transferAfter {
		// Each document builds a slice of about 1/32 of the tail (at least
		// the budget), so that no single admission pays for all of it.
		n := max(transferBudget, len(c.tail)/32)
		end := min(c.tailDone+n, len(c.tail))
		if c.tailPart == nil {
			c.tailPart = identityTransfer()
		}
		c.tailPart = c.tailPart.then(newFNVTransfer(c.tail[c.tailDone:end]))
		c.tailDone = end
		if end == len(c.tail) {
			c.tailTransfer, c.tailPart = c.tailPart, nil
			return c.tailTransfer.apply(h)
		}
	}
	return fnvUpdate(h, c.tail)
}

// Encode returns the checkpoint document of entries (in the order given; nil
// and empty differ, as in New) and registered, and its checksum. The
// document is the caller's until the second Encode after this one, which
// writes over its memory.
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
		_, text := entries[i].encoded()
		h = entries[i].hashFrom(h, text, &budget)
		c.states = append(c.states, h)
	}
	sum := uint64(c.hashTail(h, isNil, registered))

	// The JSON: the bytes of the unchanged entries, then the rest.
	size := 0
	for i := k; i < len(entries); i++ {
		json, _ := entries[i].encoded()
		size += len(json) + 1
	}
	need := 64 + size + sizeHint(registered)
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
		json, _ := entries[i].encoded()
		blob = append(blob, json...)
		c.offsets = append(c.offsets, len(blob))
	}
	if !isNil {
		blob = append(blob, ']')
	}
	blob = append(blob, `,"RegisteredDevices":`...)
	blob = appendRegistered(blob, registered)
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
