package checkpoint

import (
	"slices"
	"strconv"
)

// The kubelet's checksum is FNV-1a (32 bit) over the text that go-spew prints for
// the checkpointData value with the configuration of k8s.io/utils/dump.ForHash
// (%#v, sorted map keys, no methods, no pointer addresses, no capacities).
// Rendering that text through reflection is the most expensive part of a
// checkpoint write, so this file prints the same text by hand, straight into the
// hash, without building it in memory. checksum_test.go proves the two equal
// with go-spew itself as the reference, on fixtures and under fuzzing.

const (
	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
)

// hasher is an allocation-free FNV-1a 32 state that accepts strings and bytes.
type hasher uint32

func newHasher() hasher { return fnvOffset32 }

func (h *hasher) str(s string) {
	v := *h
	for i := 0; i < len(s); i++ {
		v ^= hasher(s[i])
		v *= fnvPrime32
	}
	*h = v
}

func (h *hasher) byte(b byte) {
	*h = (*h ^ hasher(b)) * fnvPrime32
}

func (h *hasher) int(n int64) {
	var buf [20]byte
	for _, b := range strconv.AppendInt(buf[:0], n, 10) {
		h.byte(b)
	}
}

// byteText holds the decimal text of every byte value, for AllocResp.
var byteText = func() (t [256]string) {
	for i := range t {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

// stringList prints a []string the way spew prints a slice element or map
// value: "<nil>" or "[a b c]", with the strings raw.
func (h *hasher) stringList(ids []string) {
	if ids == nil {
		h.str("<nil>")
		return
	}
	h.byte('[')
	for i, id := range ids {
		if i > 0 {
			h.byte(' ')
		}
		h.str(id)
	}
	h.byte(']')
}

func (h *hasher) bytes(b []byte) {
	if b == nil {
		h.str("<nil>")
		return
	}
	h.byte('[')
	for i, c := range b {
		if i > 0 {
			h.byte(' ')
		}
		h.str(byteText[c])
	}
	h.byte(']')
}

func (h *hasher) numaMap(m DevicesPerNUMA) {
	if m == nil {
		h.str("<nil>")
		return
	}
	var small [8]int64
	keys := small[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h.str("map[")
	for i, k := range keys {
		if i > 0 {
			h.byte(' ')
		}
		h.int(k)
		h.byte(':')
		h.stringList(m[k])
	}
	h.byte(']')
}

func (h *hasher) registered(m map[string][]string) {
	if m == nil {
		h.str("<nil>")
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h.str("map[")
	for i, k := range keys {
		if i > 0 {
			h.byte(' ')
		}
		h.str(k)
		h.byte(':')
		h.stringList(m[k])
	}
	h.byte(']')
}

// entryHead prints an entry up to and including "DeviceIDs:"; the caller prints
// the device IDs in its layout and then calls entryTail.
func (h *hasher) entryHead(podUID, containerName, resourceName string) {
	h.str("{PodUID:(string)")
	h.str(podUID)
	h.str(" ContainerName:(string)")
	h.str(containerName)
	h.str(" ResourceName:(string)")
	h.str(resourceName)
	h.str(" DeviceIDs:")
}

func (h *hasher) entryTail(allocResp []byte) {
	h.str(" AllocResp:([]uint8)")
	h.bytes(allocResp)
	h.byte('}')
}

// document prints the whole checkpointData text: n entries (isNil for a nil
// slice), each printed by entry, then the registered devices.
func (h *hasher) document(isNil bool, n int, entry func(i int), registered map[string][]string) {
	h.str("(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)")
	if isNil {
		h.str("<nil>")
	} else {
		h.byte('[')
		for i := range n {
			if i > 0 {
				h.byte(' ')
			}
			entry(i)
		}
		h.byte(']')
	}
	h.str(" RegisteredDevices:(map[string][]string)")
	h.registered(registered)
	h.byte('}')
}

// checksumOf returns the kubelet checksum of d.
func checksumOf(d *checkpointData) uint64 {
	h := newHasher()
	h.document(d.PodDeviceEntries == nil, len(d.PodDeviceEntries), func(i int) {
		e := &d.PodDeviceEntries[i]
		h.entryHead(e.PodUID, e.ContainerName, e.ResourceName)
		h.str("(checkpoint.DevicesPerNUMA)")
		h.numaMap(e.DeviceIDs)
		h.entryTail(e.AllocResp)
	}, d.RegisteredDevices)
	return uint64(h)
}

// legacyChecksumOf returns the checksum a kubelet before 1.20 computed for d,
// whose entries held DeviceIDs as a plain []string.
func legacyChecksumOf(d *legacyCheckpointData) uint64 {
	h := newHasher()
	h.document(d.PodDeviceEntries == nil, len(d.PodDeviceEntries), func(i int) {
		e := &d.PodDeviceEntries[i]
		h.entryHead(e.PodUID, e.ContainerName, e.ResourceName)
		h.str("([]string)")
		h.stringList(e.DeviceIDs)
		h.entryTail(e.AllocResp)
	}, d.RegisteredDevices)
	return uint64(h)
}
