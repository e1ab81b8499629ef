package endpoint

import (
	"bytes"
	"fmt"
	"math/bits"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// listCodec decodes the messages of one ListAndWatch stream. A plugin sends
// its whole device list on every change, and nearly all of it is what it sent
// the time before, in the same order: each device whose encoding is byte for
// byte the one at the same place in the previous message gets the *Device
// decoded then, so that decoding an update of 10,000 devices costs a
// comparison per unchanged device instead of a decode and its allocations,
// and the manager can tell an unchanged device by its pointer. The other
// devices are decoded by decodeDevice, or by proto.Unmarshal when their
// encoding is not in the usual form; a message with any field but the
// devices is decoded by proto.Unmarshal whole. The result is what
// proto.Unmarshal gives (the tests and a fuzz target compare the two).
//
// The *Device values are shared between messages and must not be modified.
// A listCodec belongs to one stream: gRPC calls Unmarshal for one message at
// a time.
type listCodec struct {
	proto encoding.CodecV2
	// prev is the last message, spans the place of each device's encoding
	// in it and devs the devices decoded from them; all nil after a message
	// that was not a device list. spare is an array for the next spans.
	prev  []byte
	spans []span
	devs  []*pluginapi.Device
	spare []span
	// bufs are two arrays that take the messages in turn, so that one can
	// hold prev while the other takes the next message; turn is the one
	// that took the last.
	bufs [2][]byte
	turn int
	// lastSize is the size of the last device list decoded.
	lastSize int
	// topologies are the topologies decoded so far, by encoding.
	topologies topologyCache
}

// topologyCache shares one *TopologyInfo among the devices whose topology is
// encoded with the same bytes: a node has a handful of NUMA layouts and
// thousands of devices, so a list costs a map lookup per device instead of
// three allocations. The values are shared like the devices themselves and
// must not be modified. It keeps at most maxTopologies encodings of at most
// maxTopologyBytes each (a NUMA node takes 2 to 4 bytes), a few kilobytes
// in all; any other topology is decoded per device.
type topologyCache map[string]*pluginapi.TopologyInfo

const (
	maxTopologies    = 64
	maxTopologyBytes = 64
)

// decode returns the topology encoded in b (see decodeTopology), shared when
// the same bytes were seen before. A nil cache shares nothing.
func (c *topologyCache) decode(b []byte) (*pluginapi.TopologyInfo, bool) {
	if c == nil || len(b) > maxTopologyBytes {
		return decodeTopology(b)
	}
	if t, ok := (*c)[string(b)]; ok {
		return t, true
	}
	t, ok := decodeTopology(b)
	if ok && len(*c) < maxTopologies {
		if *c == nil {
			*c = topologyCache{}
		}
		(*c)[string(b)] = t
	}
	return t, ok
}

type span struct{ start, end int }

func newListCodec() *listCodec {
	return &listCodec{proto: encoding.GetCodecV2("proto")}
}

// Name is empty so that the call keeps gRPC's default content type,
// "application/grpc", as the kubelet sends it, instead of "+" the name.
func (*listCodec) Name() string { return "" }

func (c *listCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c *listCodec) Unmarshal(data mem.BufferSlice, v any) error {
	msg, ok := v.(*pluginapi.ListAndWatchResponse)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	raw := c.buffer(data.Len())
	data.CopyTo(raw)
	c.lastSize = len(raw)
	spans, ok := deviceSpans(raw, c.spare[:0])
	if !ok {
		// Not a device list in the usual form: nothing is kept for the next
		// message, and no array that is oversized for this one either.
		c.reset()
		c.dropOversized(len(raw), 0)
		return proto.Unmarshal(raw, msg)
	}
	devs := make([]*pluginapi.Device, len(spans))
	fresh := len(spans)
	for i, s := range spans {
		if i < len(c.spans) && c.same(raw, s, i) {
			devs[i] = c.devs[i]
			fresh--
		}
	}
	// When every device is new (a first list, a list replaced whole), they
	// are decoded into one array: an array lives as long as any of its
	// devices, and here they all go together when the next whole list
	// comes. The devices of a partial update are allocated one by one, as
	// unchanged devices outlive their message: one array per update would
	// keep every past update's array alive through its last unchanged
	// device. A device that changed but kept its ID (a health flip) keeps
	// its ID string.
	var slab []pluginapi.Device
	if fresh == len(spans) {
		slab = make([]pluginapi.Device, fresh)
	}
	for i, s := range spans {
		if devs[i] != nil {
			continue
		}
		var d *pluginapi.Device
		if slab != nil {
			d, slab = &slab[0], slab[1:]
		} else {
			d = &pluginapi.Device{}
		}
		var prevID string
		if i < len(c.devs) {
			prevID = c.devs[i].ID
		}
		if !decodeDevice(raw[s.start:s.end], d, &c.topologies, prevID) {
			if err := proto.Unmarshal(raw[s.start:s.end], d); err != nil {
				c.reset()
				return fmt.Errorf("device %d of the list: %w", i, err)
			}
		}
		devs[i] = d
	}
	proto.Reset(msg)
	if len(devs) > 0 {
		msg.Devices = devs
	}
	c.keep(raw, spans, devs)
	return nil
}

// buffer returns an array of n bytes for the next message: the one of bufs
// that does not hold prev, replaced when it is smaller than n or oversized
// for n (see keep).
func (c *listCodec) buffer(n int) []byte {
	c.turn ^= 1
	b := c.bufs[c.turn]
	if cap(b) < n || oversized(cap(b), n) {
		b = make([]byte, n)
		c.bufs[c.turn] = b
	}
	return b[:n]
}

// oversized reports whether an array of c bytes is too large to keep for n
// bytes: more than four times n, past a floor under which any array is
// kept. A stream's lists can shrink a hundredfold (a plugin restarted with
// fewer devices), and what was kept for the largest should go with it.
func oversized(c, n int) bool { return c > 4*(n+minKeptBuffer) }

// minKeptBuffer: an array is kept for any message if it is no larger than
// four times this.
const minKeptBuffer = 64 << 10

// spanBytes is the size of a span, for oversized.
const spanBytes = 2 * bits.UintSize / 8

// same reports whether span s of raw encodes what the previous message
// encoded at place i.
func (c *listCodec) same(raw []byte, s span, i int) bool {
	p := c.spans[i]
	return bytes.Equal(raw[s.start:s.end], c.prev[p.start:p.end])
}

// keep remembers a decoded message for the next one; the previous spans'
// array is reused for the spans after it. The arrays that held the previous
// message and its spans go now if they are oversized for this one, instead
// of on their next turn: after a huge list, one smaller list is enough for
// a stream that then falls quiet to keep nothing of the huge one.
func (c *listCodec) keep(raw []byte, spans []span, devs []*pluginapi.Device) {
	c.spare = c.spans
	c.dropOversized(len(raw), len(spans))
	c.prev, c.spans, c.devs = raw, spans, devs
}

// dropOversized lets go of the spare spans and of the message array that
// did not take the last message (n bytes, with spans devices), if they are
// oversized for it.
func (c *listCodec) dropOversized(n, spans int) {
	if oversized(cap(c.spare)*spanBytes, spans*spanBytes) {
		c.spare = nil
	}
	if other := c.turn ^ 1; oversized(cap(c.bufs[other]), n) {
		c.bufs[other] = nil
	}
}

// reset forgets the previous message.
func (c *listCodec) reset() { c.prev, c.spans, c.devs = nil, nil, nil }

// deviceSpans appends to spans where each device's encoding lies in b, an
// encoded ListAndWatchResponse; false unless b holds only well-formed device
// fields (field 1, length-delimited). Counting the fields first sizes the
// array once: growing it by appending made a first list of 10,000 devices
// 50% slower (BenchmarkListCodec), for 8% less on each update.
func deviceSpans(b []byte, spans []span) ([]span, bool) {
	if n := countDevices(b); cap(spans) < n || oversized(cap(spans)*spanBytes, n*spanBytes) {
		spans = make([]span, 0, n)
	}
	for off := 0; off < len(b); {
		start, end, ok := nextDevice(b, off)
		if !ok {
			return nil, false
		}
		spans = append(spans, span{start, end})
		off = end
	}
	return spans, true
}

// countDevices returns how many well-formed device fields b starts with.
func countDevices(b []byte) int {
	n := 0
	for off := 0; off < len(b); n++ {
		_, end, ok := nextDevice(b, off)
		if !ok {
			break
		}
		off = end
	}
	return n
}

// deviceTag is the one-byte tag of a device in a ListAndWatchResponse.
const deviceTag = 1<<3 | byte(protowire.BytesType)

// nextDevice returns where the value of the device field at b[off:] (off <
// len(b)) lies, its end being where the next field starts; false unless a
// well-formed device field starts there.
func nextDevice(b []byte, off int) (start, end int, ok bool) {
	// Nearly always the tag is one byte and so is the length: a device's
	// encoding is under 128 bytes.
	if b[off] == deviceTag && off+1 < len(b) && b[off+1] < 0x80 {
		start = off + 2
		end = start + int(b[off+1])
		return start, end, end <= len(b)
	}
	num, typ, n := protowire.ConsumeTag(b[off:])
	if n < 0 || num != 1 || typ != protowire.BytesType {
		return 0, 0, false
	}
	v, m := protowire.ConsumeBytes(b[off+n:])
	if m < 0 {
		return 0, 0, false
	}
	end = off + n + m
	return end - len(v), end, true
}

// decodeDevice decodes b, the encoding of one Device, into d (new) when it
// has the form marshallers write: the ID, the health and the topology each
// at most once and in that order, the topology holding NUMA nodes of one ID
// each, strings in UTF-8. It returns false, leaving d to be decoded again
// by proto.Unmarshal, for anything else: other orders, repeated or unknown
// fields, malformed bytes. The health strings the API defines are shared,
// not copied, and so are topologies through topologies (which may be nil)
// and prevID, a valid ID, when the ID is the same.
func decodeDevice(b []byte, d *pluginapi.Device, topologies *topologyCache, prevID string) bool {
	last := protowire.Number(0)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num <= last || num > 3 || typ != protowire.BytesType {
			return false
		}
		last = num
		b = b[n:]
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch num {
		case 1:
			switch {
			case prevID != "" && string(v) == prevID:
				d.ID = prevID
			case !utf8.Valid(v):
				return false
			default:
				d.ID = string(v)
			}
		case 2:
			switch string(v) {
			case pluginapi.Healthy:
				d.Health = pluginapi.Healthy
			case pluginapi.Unhealthy:
				d.Health = pluginapi.Unhealthy
			default:
				if !utf8.Valid(v) {
					return false
				}
				d.Health = string(v)
			}
		case 3:
			t, ok := topologies.decode(v)
			if !ok {
				return false
			}
			d.Topology = t
		}
	}
	return true
}

// decodeTopology decodes a TopologyInfo of NUMA nodes that hold nothing but
// their ID; false for anything else.
func decodeTopology(b []byte) (*pluginapi.TopologyInfo, bool) {
	t := &pluginapi.TopologyInfo{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num != 1 || typ != protowire.BytesType {
			return nil, false
		}
		b = b[n:]
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		node := &pluginapi.NUMANode{}
		if len(v) > 0 {
			num, typ, n := protowire.ConsumeTag(v)
			if n < 0 || num != 1 || typ != protowire.VarintType {
				return nil, false
			}
			id, m := protowire.ConsumeVarint(v[n:])
			if m < 0 || n+m != len(v) {
				return nil, false
			}
			node.ID = int64(id)
		}
		t.Nodes = append(t.Nodes, node)
	}
	return t, true
}
