package plugintest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func marshalList(t *testing.T, devs []*pluginapi.Device) []byte {
	t.Helper()
	b, err := proto.Marshal(&pluginapi.ListAndWatchResponse{Devices: devs})
	require.NoError(t, err)
	return b
}

// randomDevice makes a device of any shape encodeList takes: empty and long
// strings (lengths over 127 take a two-byte varint), non-ASCII IDs, no
// topology, an empty one, and nodes with zero, negative and large IDs, now
// and then enough of them for the topology to pass 127 bytes.
func randomDevice(r *rand.Rand) *pluginapi.Device {
	str := func() string {
		switch r.IntN(6) {
		case 0:
			return ""
		case 1:
			return strings.Repeat("x", 100+r.IntN(200))
		case 2:
			return fmt.Sprintf("gpu-%d-é-日本", r.IntN(1000))
		default:
			return fmt.Sprintf("GPU-%08x-%04x", r.Uint32(), r.IntN(1<<16))
		}
	}
	d := &pluginapi.Device{ID: str()}
	switch r.IntN(3) {
	case 0:
		d.Health = pluginapi.Healthy
	case 1:
		d.Health = str()
	}
	switch r.IntN(4) {
	case 0:
	case 1:
		d.Topology = &pluginapi.TopologyInfo{}
	default:
		d.Topology = &pluginapi.TopologyInfo{}
		n := 1 + r.IntN(3)
		if r.IntN(4) == 0 {
			n = 13 + r.IntN(60)
		}
		for range n {
			ids := []int64{0, 1, -1, int64(r.IntN(300)), math.MaxInt64, math.MinInt64}
			d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: ids[r.IntN(len(ids))]})
		}
	}
	return d
}

// encodeList writes what proto.Marshal writes, for every shape of list it
// takes.
func TestEncodeListMatchesMarshal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		devs := make([]*pluginapi.Device, r.IntN(20))
		for j := range devs {
			devs[j] = randomDevice(r)
		}
		got, ok := encodeList(devs, 0)
		require.True(t, ok, "list %d", i)
		require.Equal(t, marshalList(t, devs), got, "list %d: %v", i, devs)
	}
	for _, devs := range [][]*pluginapi.Device{nil, {}, {{}}} {
		got, ok := encodeList(devs, 0)
		require.True(t, ok)
		assert.Equal(t, marshalList(t, devs), got)
	}
}

func withUnknown(m proto.Message) {
	m.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7))
}

// unusualLists are the lists encodeList refuses, one reason each.
func unusualLists() map[string][]*pluginapi.Device {
	odd := &pluginapi.Device{ID: "u", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}, {ID: 2}}}}
	withUnknown(odd)
	oddTopo := &pluginapi.Device{ID: "t", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}}
	withUnknown(oddTopo.Topology)
	oddNode := &pluginapi.Device{ID: "n", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 3}}}}
	withUnknown(oddNode.Topology.Nodes[0])
	plain := func() *pluginapi.Device { return &pluginapi.Device{ID: "a", Health: pluginapi.Healthy} }
	return map[string][]*pluginapi.Device{
		"nil device":             {plain(), nil},
		"nil node":               {{ID: "d", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}, nil}}}},
		"empty node list":        {plain(), {ID: "c", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{}}}},
		"unknown fields, device": {plain(), odd},
		"unknown fields, topo":   {oddTopo},
		"unknown fields, node":   {oddNode},
		"ID not UTF-8":           {plain(), {ID: "gpu-\xff"}},
		"health not UTF-8":       {{ID: "b", Health: "\xc3("}},
	}
}

func TestEncodeListRefusesUnusualLists(t *testing.T) {
	for name, devs := range unusualLists() {
		_, ok := encodeList(devs, 0)
		assert.False(t, ok, name)
		m := newListMessage(devs, 0)
		require.NotNil(t, m.msg, name)
		for i, d := range devs {
			if d == nil {
				assert.Nil(t, m.msg.Devices[i], name)
				continue
			}
			assert.True(t, proto.Equal(d, m.msg.Devices[i]), "%s: device %d", name, i)
			assert.NotSame(t, d, m.msg.Devices[i], name)
		}
	}
}

// A list encodeList refuses reaches the client as gRPC encodes it: unknown
// fields and nil entries (as empty devices) arrive, and a string that is not
// UTF-8 ends the stream with the marshalling error, as it always has.
func TestListAndWatchSendsUnusualLists(t *testing.T) {
	for name, devs := range unusualLists() {
		t.Run(name, func(t *testing.T) {
			p, client := startPlugin(t, Options{Devices: devices("first")})
			ctx := testContext(t)
			stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
			require.NoError(t, err)
			assert.Equal(t, []string{"first"}, recvIDs(t, stream))

			p.Update(devs)
			msg, err := stream.Recv()
			if strings.Contains(name, "UTF-8") {
				require.Error(t, err)
				assert.Equal(t, codes.Internal, status.Code(err), "%v", err)
				assert.Contains(t, err.Error(), "UTF-8")
				return
			}
			require.NoError(t, err)
			want := &pluginapi.ListAndWatchResponse{}
			require.NoError(t, proto.Unmarshal(marshalList(t, devs), want))
			requireProtoEqual(t, want, msg)
		})
	}
}

// Devices copies the list, whichever way it is held: it shares nothing with
// Update's argument or with an earlier copy, and keeps nil and empty lists
// apart, as Update was given them.
func TestDevicesCopies(t *testing.T) {
	lists := unusualLists()
	lists["plain"] = []*pluginapi.Device{
		{ID: "a", Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}},
		{ID: "b"},
		{ID: "c", Topology: &pluginapi.TopologyInfo{}},
	}
	lists["empty"] = []*pluginapi.Device{}
	lists["nil"] = nil
	for name, devs := range lists {
		p, err := New(Options{ResourceName: testResource})
		require.NoError(t, err)
		p.Update(devs)
		got := p.Devices()
		require.Len(t, got, len(devs), name)
		assert.Equal(t, devs == nil, got == nil, "%s: nil and empty lists", name)
		again := p.Devices()
		for i, d := range devs {
			if d == nil {
				assert.Nil(t, got[i], name)
				continue
			}
			assert.True(t, proto.Equal(d, got[i]), "%s: device %d: %v, want %v", name, i, got[i], d)
			assert.NotSame(t, d, got[i], name)
			assert.NotSame(t, got[i], again[i], name)
			if d.Topology != nil {
				assert.NotSame(t, d.Topology, got[i].Topology, name)
				assert.Equal(t, d.Topology.Nodes == nil, got[i].Topology.Nodes == nil, "%s: device %d: nil and empty nodes", name, i)
			}
		}
	}
}

// encodeList writes the fields it knows; a field added to the API's
// messages would be dropped, so this fails first.
func TestEncodeListKnowsEveryField(t *testing.T) {
	fields := func(m proto.Message) []string {
		var names []string
		fs := m.ProtoReflect().Descriptor().Fields()
		for i := range fs.Len() {
			names = append(names, string(fs.Get(i).Name()))
		}
		return names
	}
	assert.Equal(t, []string{"devices"}, fields(&pluginapi.ListAndWatchResponse{}))
	assert.Equal(t, []string{"ID", "health", "topology"}, fields(&pluginapi.Device{}))
	assert.Equal(t, []string{"nodes"}, fields(&pluginapi.TopologyInfo{}))
	assert.Equal(t, []string{"ID"}, fields(&pluginapi.NUMANode{}))
}

// FuzzEncodeList compares encodeList with proto.Marshal on every list that
// proto.Unmarshal makes of the input. A list it refuses must hold unknown
// fields (proto.Unmarshal yields neither nil devices nor strings that are not
// UTF-8): reading the input again without them must give another message.
func FuzzEncodeList(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 8 {
		devs := make([]*pluginapi.Device, 1+r.IntN(5))
		for j := range devs {
			devs[j] = randomDevice(r)
		}
		b, err := proto.Marshal(&pluginapi.ListAndWatchResponse{Devices: devs})
		require.NoError(f, err)
		f.Add(b)
	}
	odd := &pluginapi.ListAndWatchResponse{Devices: unusualLists()["unknown fields, node"]}
	b, err := proto.Marshal(odd)
	require.NoError(f, err)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var m pluginapi.ListAndWatchResponse
		if proto.Unmarshal(b, &m) != nil {
			return
		}
		got, ok := encodeList(m.Devices, len(b))
		if !ok {
			var known pluginapi.ListAndWatchResponse
			require.NoError(t, proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, &known))
			assert.False(t, proto.Equal(&m, &known), "refused a list without unknown fields: %v", &m)
			return
		}
		want, err := proto.Marshal(&pluginapi.ListAndWatchResponse{Devices: m.Devices})
		require.NoError(t, err)
		assert.Equal(t, want, got)
	})
}
