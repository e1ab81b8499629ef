package checkpoint

import (
	"encoding/base64"
	"maps"
	"slices"
	"strconv"
	"unicode/utf8"
)

// The JSON document is written by hand, byte for byte as encoding/json writes
// the kubelet's structs (field order, map keys sorted as strings, HTML-safe
// string escaping, invalid UTF-8 replaced, base64 bytes), without reflection.
// encode_test.go proves the two equal, on fixtures and under fuzzing.

const hexDigits = "0123456789abcdef"

// plainASCII marks the ASCII bytes encoding/json copies as they are.
var plainASCII = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// appendString appends s as encoding/json does with HTML escaping on.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if plainASCII[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

func appendStrings(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

func appendBytes(b []byte, p []byte) []byte {
	if p == nil {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, p)
	return append(b, '"')
}

func appendNUMA(b []byte, m DevicesPerNUMA) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	type kv struct {
		key string
		ids []string
	}
	var small [4]kv
	keys := small[:0]
	for k, ids := range m {
		keys = append(keys, kv{strconv.FormatInt(k, 10), ids})
	}
	slices.SortFunc(keys, func(a, b kv) int { return compareStrings(a.key, b.key) })
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, k.key...)
		b = append(b, '"', ':')
		b = appendStrings(b, k.ids)
	}
	return append(b, '}')
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func appendRegistered(b []byte, m map[string][]string) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	keys := slices.Sorted(maps.Keys(m))
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendStrings(b, m[k])
	}
	return append(b, '}')
}

// appendDocument writes {"Data":{"PodDeviceEntries":E,"RegisteredDevices":R},"Checksum":N}
// with n entries (isNil: a nil slice), each written by entry.
func appendDocument(b []byte, isNil bool, n int, entry func(b []byte, i int) []byte,
	registered map[string][]string, checksum uint64) []byte {
	b = append(b, `{"Data":{"PodDeviceEntries":`...)
	if isNil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range n {
			if i > 0 {
				b = append(b, ',')
			}
			b = entry(b, i)
		}
		b = append(b, ']')
	}
	b = append(b, `,"RegisteredDevices":`...)
	b = appendRegistered(b, registered)
	b = append(b, `},"Checksum":`...)
	b = strconv.AppendUint(b, checksum, 10)
	return append(b, '}')
}

func appendEntryHead(b []byte, podUID, containerName, resourceName string) []byte {
	b = append(b, `{"PodUID":`...)
	b = appendString(b, podUID)
	b = append(b, `,"ContainerName":`...)
	b = appendString(b, containerName)
	b = append(b, `,"ResourceName":`...)
	b = appendString(b, resourceName)
	return append(b, `,"DeviceIDs":`...)
}

func appendEntryTail(b []byte, allocResp []byte) []byte {
	b = append(b, `,"AllocResp":`...)
	b = appendBytes(b, allocResp)
	return append(b, '}')
}

// sizeHint estimates the encoded size of the registered devices and of the
// entries' strings, so that the buffer is allocated once.
func sizeHint(registered map[string][]string) int {
	n := 128
	for k, ids := range registered {
		n += len(k) + 8
		for _, id := range ids {
			n += len(id) + 3
		}
	}
	return n
}

func entrySize(podUID, containerName, resourceName string, allocResp []byte) int {
	return 96 + len(podUID) + len(containerName) + len(resourceName) + base64.StdEncoding.EncodedLen(len(allocResp))
}

// encodeJSON returns the document of d with checksum, as encoding/json would.
func encodeJSON(d *checkpointData, checksum uint64) []byte {
	n := sizeHint(d.RegisteredDevices)
	for i := range d.PodDeviceEntries {
		e := &d.PodDeviceEntries[i]
		n += entrySize(e.PodUID, e.ContainerName, e.ResourceName, e.AllocResp)
		for _, ids := range e.DeviceIDs {
			n += 8
			for _, id := range ids {
				n += len(id) + 3
			}
		}
	}
	b := make([]byte, 0, n)
	return appendDocument(b, d.PodDeviceEntries == nil, len(d.PodDeviceEntries), func(b []byte, i int) []byte {
		e := &d.PodDeviceEntries[i]
		b = appendEntryHead(b, e.PodUID, e.ContainerName, e.ResourceName)
		b = appendNUMA(b, e.DeviceIDs)
		return appendEntryTail(b, e.AllocResp)
	}, d.RegisteredDevices, checksum)
}

// encodeLegacyJSON is encodeJSON for the pre-1.20 layout.
func encodeLegacyJSON(d *legacyCheckpointData, checksum uint64) []byte {
	n := sizeHint(d.RegisteredDevices)
	for i := range d.PodDeviceEntries {
		e := &d.PodDeviceEntries[i]
		n += entrySize(e.PodUID, e.ContainerName, e.ResourceName, e.AllocResp)
		for _, id := range e.DeviceIDs {
			n += len(id) + 3
		}
	}
	b := make([]byte, 0, n)
	return appendDocument(b, d.PodDeviceEntries == nil, len(d.PodDeviceEntries), func(b []byte, i int) []byte {
		e := &d.PodDeviceEntries[i]
		b = appendEntryHead(b, e.PodUID, e.ContainerName, e.ResourceName)
		b = appendStrings(b, e.DeviceIDs)
		return appendEntryTail(b, e.AllocResp)
	}, d.RegisteredDevices, checksum)
}
