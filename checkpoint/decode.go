package checkpoint

import (
	"encoding/base64"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// decodeCanonical decodes the document as the kubelet and devmgr write it —
// compact, fields in order, nothing else — without reflection. It reports
// false for anything else (whitespace, other field order or case, unknown
// fields, the pre-1.20 layout, invalid UTF-8, odd escapes, numbers it would
// have to second-guess), and the caller then uses encoding/json, which
// decides. When it succeeds the result equals encoding/json's: decode_test.go
// and a fuzz target compare the two.
func decodeCanonical(blob []byte) (wire, bool) {
	p := parser{b: blob}
	var w wire
	if !p.lit(`{"Data":{"PodDeviceEntries":`) {
		return w, false
	}
	if p.lit("null") {
		w.Data.PodDeviceEntries = nil
	} else {
		if !p.lit("[") {
			return w, false
		}
		w.Data.PodDeviceEntries = []PodDevicesEntry{}
		for first := true; !p.lit("]"); first = false {
			if !first && !p.lit(",") {
				return w, false
			}
			e, ok := p.entry()
			if !ok {
				return w, false
			}
			w.Data.PodDeviceEntries = append(w.Data.PodDeviceEntries, e)
		}
	}
	if !p.lit(`,"RegisteredDevices":`) {
		return w, false
	}
	if p.lit("null") {
		w.Data.RegisteredDevices = nil
	} else {
		if !p.lit("{") {
			return w, false
		}
		w.Data.RegisteredDevices = map[string][]string{}
		for first := true; !p.lit("}"); first = false {
			if !first && !p.lit(",") {
				return w, false
			}
			k, ok := p.str()
			if !ok || !p.lit(":") {
				return w, false
			}
			if _, dup := w.Data.RegisteredDevices[k]; dup {
				return w, false // encoding/json merges duplicates; let it
			}
			ids, ok := p.strs()
			if !ok {
				return w, false
			}
			w.Data.RegisteredDevices[k] = ids
		}
	}
	if !p.lit(`},"Checksum":`) {
		return w, false
	}
	start := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	digits := string(p.b[start:p.i])
	if digits == "" || len(digits) > 1 && digits[0] == '0' {
		return w, false
	}
	sum, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || !p.lit("}") || p.i != len(p.b) {
		return w, false
	}
	w.Checksum = sum
	return w, true
}

type parser struct {
	b []byte
	i int
}

// lit consumes s if the input continues with it.
func (p *parser) lit(s string) bool {
	if len(p.b)-p.i < len(s) || string(p.b[p.i:p.i+len(s)]) != s {
		return false
	}
	p.i += len(s)
	return true
}

func (p *parser) entry() (PodDevicesEntry, bool) {
	var e PodDevicesEntry
	var ok bool
	if !p.lit(`{"PodUID":`) {
		return e, false
	}
	if e.PodUID, ok = p.str(); !ok || !p.lit(`,"ContainerName":`) {
		return e, false
	}
	if e.ContainerName, ok = p.str(); !ok || !p.lit(`,"ResourceName":`) {
		return e, false
	}
	if e.ResourceName, ok = p.str(); !ok || !p.lit(`,"DeviceIDs":`) {
		return e, false
	}
	if !p.lit("null") {
		if !p.lit("{") {
			return e, false
		}
		e.DeviceIDs = DevicesPerNUMA{}
		for first := true; !p.lit("}"); first = false {
			if !first && !p.lit(",") {
				return e, false
			}
			k, ok := p.str()
			if !ok || !p.lit(":") {
				return e, false
			}
			node, err := strconv.ParseInt(k, 10, 64)
			if err != nil || strconv.FormatInt(node, 10) != k {
				return e, false // "+1", "01": leave them to encoding/json
			}
			if _, dup := e.DeviceIDs[node]; dup {
				return e, false
			}
			ids, ok := p.strs()
			if !ok {
				return e, false
			}
			e.DeviceIDs[node] = ids
		}
	}
	if !p.lit(`,"AllocResp":`) {
		return e, false
	}
	if !p.lit("null") {
		s, ok := p.str()
		if !ok {
			return e, false
		}
		resp, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return e, false
		}
		e.AllocResp = resp
	}
	return e, p.lit("}")
}

// strs reads null or an array of strings.
func (p *parser) strs() ([]string, bool) {
	if p.lit("null") {
		return nil, true
	}
	if !p.lit("[") {
		return nil, false
	}
	out := []string{}
	for first := true; !p.lit("]"); first = false {
		if !first && !p.lit(",") {
			return nil, false
		}
		s, ok := p.str()
		if !ok {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

// str reads a string with the escapes encoding/json writes; any byte of
// invalid UTF-8 or a lone surrogate makes it give up.
func (p *parser) str() (string, bool) {
	if !p.lit(`"`) {
		return "", false
	}
	start := p.i
	plain := true
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			raw := p.b[start:p.i]
			p.i++
			if plain {
				if !utf8.Valid(raw) {
					return "", false
				}
				return string(raw), true
			}
			return unescape(raw)
		case c == '\\':
			plain = false
			p.i += 2
		case c < 0x20:
			return "", false
		default:
			p.i++
		}
	}
	return "", false
}

func unescape(raw []byte) (string, bool) {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(raw) {
			return "", false
		}
		switch raw[i+1] {
		case '"', '\\', '/':
			out = append(out, raw[i+1])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(raw, i+2)
			if !ok {
				return "", false
			}
			i += 6
			if utf16.IsSurrogate(r) {
				if i+1 >= len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
					return "", false
				}
				r2, ok := hex4(raw, i+2)
				if !ok {
					return "", false
				}
				if r = utf16.DecodeRune(r, r2); r == utf8.RuneError {
					return "", false
				}
				i += 6
			}
			out = utf8.AppendRune(out, r)
			continue
		default:
			return "", false
		}
		i += 2
	}
	if !utf8.Valid(out) {
		return "", false
	}
	return string(out), true
}

func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
