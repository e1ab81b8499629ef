package checkpoint

import (
	"maps"
	"slices"
	"strconv"
)

// The kubelet's checksum is FNV-1a (32 bit) over the text that go-spew prints for
// the checkpointData value with the configuration of k8s.io/utils/dump.ForHash
// (%#v, sorted map keys, no methods, no pointer addresses, no capacities).
// Printing that text through reflection is most of the kubelet's cost of a
// checkpoint write, so this file prints the same text without reflection and
// hashes it. checksum_test.go proves the two equal with go-spew itself as the
// reference, on fixtures and under fuzzing.

const (
	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
)

// fnvUpdate continues an FNV-1a 32 hash in state h over b.
func fnvUpdate[T string | []byte](h uint32, b T) uint32 {
	for i := 0; i < len(b); i++ {
		h ^= uint32(b[i])
		h *= fnvPrime32
	}
	return h
}

// fnvByte continues h over c.
func fnvByte(h uint32, c byte) uint32 { return (h ^ uint32(c)) * fnvPrime32 }

// byteText holds the decimal text of every byte value, for AllocResp.
var byteText = func() (t [256]string) {
	for i := range t {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

// The text of the hashed document is
//
//	docHead E " RegisteredDevices:(map[string][]string)" R "}"
//
// where E is "<nil>" or "[" entry texts joined by " " "]".
const (
	docHead        = "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)"
	docRegistered  = " RegisteredDevices:(map[string][]string)"
	spewNil        = "<nil>"
	numaTypePrefix = "(checkpoint.DevicesPerNUMA)"
	listTypePrefix = "([]string)"
)

// appendStringListText prints a []string the way spew prints a slice element
// or map value: "<nil>" or "[a b c]", with the strings raw.
func appendStringListText(b []byte, ids []string) []byte {
	if ids == nil {
		return append(b, spewNil...)
	}
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, id...)
	}
	return append(b, ']')
}

func appendBytesText(b []byte, p []byte) []byte {
	if p == nil {
		return append(b, spewNil...)
	}
	b = append(b, '[')
	for i, c := range p {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, byteText[c]...)
	}
	return append(b, ']')
}

func appendNUMAText(b []byte, m DevicesPerNUMA) []byte {
	if m == nil {
		return append(b, spewNil...)
	}
	var small [8]int64
	keys := small[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, "map["...)
	for i, k := range keys {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendInt(b, k, 10)
		b = append(b, ':')
		b = appendStringListText(b, m[k])
	}
	return append(b, ']')
}

// hashRegistered continues h over the text spew prints for the registered
// devices, "<nil>" or "map[k1:[a b] k2:<nil>]" with keys sorted, reading the
// names and IDs where they are: with tens of thousands of IDs, printing the
// text first would copy it all.
func hashRegistered(h uint32, m map[string][]string) uint32 {
	if m == nil {
		return fnvUpdate(h, spewNil)
	}
	h = fnvUpdate(h, "map[")
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			h = fnvByte(h, ' ')
		}
		h = fnvByte(fnvUpdate(h, k), ':')
		ids := m[k]
		if ids == nil {
			h = fnvUpdate(h, spewNil)
			continue
		}
		h = fnvByte(h, '[')
		for j, id := range ids {
			if j > 0 {
				h = fnvByte(h, ' ')
			}
			h = fnvUpdate(h, id)
		}
		h = fnvByte(h, ']')
	}
	return fnvByte(h, ']')
}

// appendEntryHeadText prints an entry up to and including "DeviceIDs:"; the
// caller prints the device IDs in its layout and then appendEntryTailText.
func appendEntryHeadText(b []byte, podUID, containerName, resourceName string) []byte {
	b = append(b, "{PodUID:(string)"...)
	b = append(b, podUID...)
	b = append(b, " ContainerName:(string)"...)
	b = append(b, containerName...)
	b = append(b, " ResourceName:(string)"...)
	b = append(b, resourceName...)
	return append(b, " DeviceIDs:"...)
}

func appendEntryTailText(b []byte, allocResp []byte) []byte {
	b = append(b, " AllocResp:([]uint8)"...)
	b = appendBytesText(b, allocResp)
	return append(b, '}')
}

// appendEntryText prints one entry of the current layout.
func appendEntryText(b []byte, e *PodDevicesEntry) []byte {
	b = appendEntryHeadText(b, e.PodUID, e.ContainerName, e.ResourceName)
	b = append(b, numaTypePrefix...)
	b = appendNUMAText(b, e.DeviceIDs)
	return appendEntryTailText(b, e.AllocResp)
}

// hashDocument returns the checksum of a document of n entries (isNil: a nil
// entry list) and the registered devices. hashEntry continues the hash from
// state h over the text of entry i.
func hashDocument(isNil bool, n int, hashEntry func(h uint32, i int) uint32, registered map[string][]string) uint64 {
	h := fnvUpdate(fnvOffset32, docHead)
	if isNil {
		h = fnvUpdate(h, spewNil)
	} else {
		h = fnvByte(h, '[')
		for i := range n {
			if i > 0 {
				h = fnvByte(h, ' ')
			}
			h = hashEntry(h, i)
		}
		h = fnvByte(h, ']')
	}
	h = fnvUpdate(h, docRegistered)
	h = hashRegistered(h, registered)
	return uint64(fnvByte(h, '}'))
}

// checksumOf returns the kubelet checksum of d.
func checksumOf(d *checkpointData) uint64 {
	var text []byte
	return hashDocument(d.PodDeviceEntries == nil, len(d.PodDeviceEntries), func(h uint32, i int) uint32 {
		text = appendEntryText(text[:0], &d.PodDeviceEntries[i])
		return fnvUpdate(h, text)
	}, d.RegisteredDevices)
}

// legacyChecksumOf returns the checksum a pre-1.20 kubelet computed for d,
// whose entries held DeviceIDs as a plain []string.
func legacyChecksumOf(d *legacyCheckpointData) uint64 {
	var text []byte
	return hashDocument(d.PodDeviceEntries == nil, len(d.PodDeviceEntries), func(h uint32, i int) uint32 {
		e := &d.PodDeviceEntries[i]
		text = appendEntryHeadText(text[:0], e.PodUID, e.ContainerName, e.ResourceName)
		text = append(text, listTypePrefix...)
		text = appendStringListText(text, e.DeviceIDs)
		text = appendEntryTailText(text, e.AllocResp)
		return fnvUpdate(h, text)
	}, d.RegisteredDevices)
}
