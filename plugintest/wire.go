package plugintest

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// A listMessage is one device list as the streams send it. Update encodes
// the list once, for every stream, instead of copying it and letting each
// stream encode the copy: with 10,000 devices the copy and gRPC's encoding
// take about 0.7 and 1 ms, encodeList 0.7 ms for both, and that time lies
// between Update and the first byte on the wire of every test that measures
// a device update. A list encodeList cannot encode (a nil device,
// unknown fields, a string that is not UTF-8) is copied and sent as a
// message, so that gRPC encodes it, or fails to, exactly as before.
//
// A listMessage is never modified once made, so one may be queued on
// several streams at once.
type listMessage struct {
	msg  *pluginapi.ListAndWatchResponse // nil when wire holds the list
	wire encodedList
	// empty is set for a list that was empty but not nil, which wire does
	// not tell from nil, so that devices gives back what Update was given.
	empty bool
}

// encodedList is the wire encoding of a ListAndWatchResponse, sent as it is
// by wireCodec.
type encodedList []byte

// newListMessage makes the message of devices; sizeHint is the size its
// encoding likely has (that of the list before it).
func newListMessage(devices []*pluginapi.Device, sizeHint int) listMessage {
	if wire, ok := encodeList(devices, sizeHint); ok {
		return listMessage{wire: wire, empty: devices != nil && len(devices) == 0}
	}
	return listMessage{msg: &pluginapi.ListAndWatchResponse{Devices: cloneDevices(devices)}}
}

// value returns what a stream sends: the message, or its encoding.
func (m listMessage) value() any {
	if m.msg != nil {
		return m.msg
	}
	return m.wire
}

// devices returns a deep copy of the list.
func (m listMessage) devices() []*pluginapi.Device {
	if m.msg != nil {
		return cloneDevices(m.msg.Devices)
	}
	var r pluginapi.ListAndWatchResponse
	if err := proto.Unmarshal(m.wire, &r); err != nil {
		// encodeList wrote it; proto.Unmarshal reads what proto.Marshal
		// writes, and the tests hold the two equal.
		panic(fmt.Sprintf("plugintest: cannot decode an encoded device list: %v", err))
	}
	if m.empty {
		return []*pluginapi.Device{}
	}
	return r.Devices
}

// Field numbers of the device-plugin API's messages.
const (
	fieldListDevices   protowire.Number = 1 // ListAndWatchResponse.devices
	fieldDeviceID      protowire.Number = 1 // Device.ID
	fieldDeviceHealth  protowire.Number = 2 // Device.health
	fieldDeviceTopo    protowire.Number = 3 // Device.topology
	fieldTopologyNodes protowire.Number = 1 // TopologyInfo.nodes
	fieldNodeID        protowire.Number = 1 // NUMANode.ID
)

// encodeList returns the bytes proto.Marshal gives for a ListAndWatchResponse
// holding devices, or false when a device is not one it can encode: nil (or
// with a nil NUMA node), holding unknown fields, or with a string that is not
// valid UTF-8 (which proto.Marshal refuses). It also refuses a topology whose
// node list is empty but not nil: the bytes are those of no list, and a copy
// keeps the empty list for Devices. The tests compare encodeList with
// proto.Marshal.
//
// It reads each device once (a list of 10,000 spans megabytes of small
// objects, and every pass over them waits on memory), so the bytes are
// appended to a buffer sized from sizeHint, with room for the list to grow a
// little (a device turning Unhealthy takes two bytes more) before the
// buffer is copied to a larger one.
func encodeList(devices []*pluginapi.Device, sizeHint int) ([]byte, bool) {
	b := make([]byte, 0, sizeHint+sizeHint/16)
	for _, d := range devices {
		if !encodable(d) {
			return nil, false
		}
		topo := -1
		if d.Topology != nil {
			topo = topologySize(d.Topology)
		}
		b = protowire.AppendTag(b, fieldListDevices, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(deviceSize(d, topo)))
		b = appendDevice(b, d, topo)
	}
	return b, true
}

func encodable(d *pluginapi.Device) bool {
	if d == nil || hasUnknown(d.ProtoReflect()) || !utf8.ValidString(d.ID) || !utf8.ValidString(d.Health) {
		return false
	}
	t := d.Topology
	if t == nil {
		return true
	}
	if hasUnknown(t.ProtoReflect()) || (t.Nodes != nil && len(t.Nodes) == 0) {
		return false
	}
	for _, n := range t.Nodes {
		if n == nil || hasUnknown(n.ProtoReflect()) {
			return false
		}
	}
	return true
}

func hasUnknown(m protoreflect.Message) bool { return len(m.GetUnknown()) > 0 }

// Proto3 leaves a string or integer field out when it holds its zero value,
// and writes a message field whenever it is set, empty or not.

// deviceSize is the size of d's encoding, given its topology's (-1: none).
func deviceSize(d *pluginapi.Device, topo int) int {
	n := stringSize(fieldDeviceID, d.ID) + stringSize(fieldDeviceHealth, d.Health)
	if topo >= 0 {
		n += protowire.SizeTag(fieldDeviceTopo) + protowire.SizeBytes(topo)
	}
	return n
}

func topologySize(t *pluginapi.TopologyInfo) int {
	n := 0
	for _, node := range t.Nodes {
		n += protowire.SizeTag(fieldTopologyNodes) + protowire.SizeBytes(nodeSize(node))
	}
	return n
}

func nodeSize(node *pluginapi.NUMANode) int {
	if node.ID == 0 {
		return 0
	}
	return protowire.SizeTag(fieldNodeID) + protowire.SizeVarint(uint64(node.ID))
}

func stringSize(f protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(f) + protowire.SizeBytes(len(s))
}

func appendDevice(b []byte, d *pluginapi.Device, topo int) []byte {
	b = appendString(b, fieldDeviceID, d.ID)
	b = appendString(b, fieldDeviceHealth, d.Health)
	if topo >= 0 {
		b = protowire.AppendTag(b, fieldDeviceTopo, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(topo))
		for _, node := range d.Topology.Nodes {
			b = protowire.AppendTag(b, fieldTopologyNodes, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(nodeSize(node)))
			if node.ID != 0 {
				b = protowire.AppendTag(b, fieldNodeID, protowire.VarintType)
				b = protowire.AppendVarint(b, uint64(node.ID))
			}
		}
	}
	return b
}

func appendString(b []byte, f protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, f, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// wireCodec is the plugin server's codec: gRPC's proto codec, except that an
// encodedList goes out as the bytes it holds.
type wireCodec struct{ proto encoding.CodecV2 }

func newWireCodec() wireCodec { return wireCodec{proto: encoding.GetCodecV2(grpcproto.Name)} }

func (c wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	if l, ok := v.(encodedList); ok {
		// Read-only to gRPC; its Free does nothing, so the bytes stay the
		// list's, for the other streams.
		return mem.BufferSlice{mem.SliceBuffer(l)}, nil
	}
	return c.proto.Marshal(v)
}

func (c wireCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

func (c wireCodec) Name() string { return c.proto.Name() }
