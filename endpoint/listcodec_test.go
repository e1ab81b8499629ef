package endpoint

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"unsafe"
	"weak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// decodeBoth decodes raw with the codec and with proto.Unmarshal and
// requires the same outcome: both fail, or both give equal messages.
func decodeBoth(t *testing.T, c *listCodec, raw []byte) *pluginapi.ListAndWatchResponse {
	t.Helper()
	got := &pluginapi.ListAndWatchResponse{}
	err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, got)
	want := &pluginapi.ListAndWatchResponse{}
	wantErr := proto.Unmarshal(raw, want)
	if wantErr != nil {
		require.Error(t, err, "proto.Unmarshal fails (%v), the codec does not", wantErr)
		return nil
	}
	require.NoError(t, err)
	require.True(t, proto.Equal(want, got), "codec: %v\nproto: %v", got, want)
	return got
}

func marshal(t *testing.T, devs []*pluginapi.Device) []byte {
	t.Helper()
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(&pluginapi.ListAndWatchResponse{Devices: devs})
	require.NoError(t, err)
	return raw
}

// Over random sequences of lists (health and topology changes, reordering,
// additions, removals, duplicates), the codec decodes what proto.Unmarshal
// decodes, and it hands back the previous *Device exactly for the devices
// encoded as before at the same place.
func TestListCodecMatchesProto(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	reused, keptID := 0, 0
	for seq := 0; seq < 100; seq++ {
		c := newListCodec()
		var list []*pluginapi.Device
		for i := range rng.IntN(20) {
			list = append(list, randomDevice(rng, fmt.Sprintf("dev-%02d", i)))
		}
		var prevRaw []byte
		var prev *pluginapi.ListAndWatchResponse
		for step := 0; step < 20; step++ {
			next := make([]*pluginapi.Device, 0, len(list)+1)
			for _, d := range list {
				if rng.IntN(5) == 0 {
					d = randomDevice(rng, d.ID)
				}
				next = append(next, d)
			}
			switch rng.IntN(8) {
			case 0:
				rng.Shuffle(len(next), func(i, j int) { next[i], next[j] = next[j], next[i] })
			case 1:
				next = append(next, randomDevice(rng, fmt.Sprintf("dev-%02d", 20+rng.IntN(5))))
			case 2:
				if len(next) > 0 {
					next = next[1:]
				}
			case 3:
				if len(next) > 0 {
					next = append(next, next[rng.IntN(len(next))])
				}
			}
			list = next
			raw := marshal(t, list)
			got := decodeBoth(t, c, raw)
			if prev != nil {
				prevSpans, _ := deviceSpans(prevRaw, nil)
				spans, ok := deviceSpans(raw, nil)
				require.True(t, ok)
				same := make([]bool, len(spans))
				for i, s := range spans {
					same[i] = i < len(prevSpans) &&
						string(raw[s.start:s.end]) == string(prevRaw[prevSpans[i].start:prevSpans[i].end])
				}
				for i := range spans {
					want := same[i]
					if want {
						reused++
					}
					assert.Equal(t, want, i < len(prev.Devices) && got.Devices[i] == prev.Devices[i],
						"seq %d step %d device %d: reused", seq, step, i)
					// A device decoded again with the ID it had keeps
					// that ID's string.
					if !want && i < len(prev.Devices) && got.Devices[i].ID == prev.Devices[i].ID && got.Devices[i].ID != "" {
						keptID++
						assert.Same(t, unsafe.StringData(prev.Devices[i].ID), unsafe.StringData(got.Devices[i].ID),
							"seq %d step %d device %d: ID string kept", seq, step, i)
					}
				}
			}
			prev, prevRaw = got, raw
		}
	}
	assert.Greater(t, reused, 3000, "hardly any device was reused")
	assert.Greater(t, keptID, 1000, "hardly any device kept its ID string")
}

func randomDevice(rng *rand.Rand, id string) *pluginapi.Device {
	d := &pluginapi.Device{ID: id, Health: []string{pluginapi.Healthy, pluginapi.Unhealthy}[rng.IntN(2)]}
	if rng.IntN(2) == 0 {
		d.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(rng.IntN(2))}}}
	}
	return d
}

// Messages the fast path does not take (other fields, malformed bytes) are
// decoded, or refused, as proto.Unmarshal does, and the next message is
// decoded afresh.
func TestListCodecOtherMessages(t *testing.T) {
	devs := []*pluginapi.Device{{ID: "a", Health: pluginapi.Healthy}, {ID: "b", Health: pluginapi.Unhealthy}}
	good := marshal(t, devs)
	unknown := protowire.AppendVarint(protowire.AppendTag(append([]byte{}, good...), 7, protowire.VarintType), 42)
	badUTF8 := marshal(t, []*pluginapi.Device{{ID: "a", Health: pluginapi.Healthy}, {ID: "x", Health: pluginapi.Healthy}})
	badUTF8[len(badUTF8)-len("Healthy")-3] = 0xff // the ID "x"
	cases := map[string][]byte{
		"empty":            {},
		"unknown field":    unknown,
		"truncated":        good[:len(good)-2],
		"bad length":       append(append([]byte{}, good...), 0x0a, 0x7f),
		"wrong wire type":  {0x08, 0x01},
		"invalid UTF-8 ID": badUTF8,
		"device not a msg": {0x0a, 0x02, 0xff, 0xff},
		"lone tag":         {0x0a},
		"trailing tag":     append(append([]byte{}, good...), 0x0a),
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			c := newListCodec()
			first := decodeBoth(t, c, good)
			decodeBoth(t, c, raw)
			again := decodeBoth(t, c, good)
			assert.NotSame(t, first.Devices[0], again.Devices[0], "reused across a message that listed no such device")
		})
	}
	c0 := newListCodec()
	first := decodeBoth(t, c0, good)
	again := decodeBoth(t, c0, good)
	assert.Same(t, first.Devices[1], again.Devices[1], "the same message twice")
	// A message of another type goes to the proto codec.
	c := newListCodec()
	opts := &pluginapi.DevicePluginOptions{PreStartRequired: true}
	raw, err := proto.Marshal(opts)
	require.NoError(t, err)
	got := &pluginapi.DevicePluginOptions{}
	require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, got))
	assert.True(t, proto.Equal(opts, got))
	out, err := c.Marshal(opts)
	require.NoError(t, err)
	assert.Equal(t, raw, out.Materialize())
}

// FuzzListCodec decodes two messages in turn, four times in a row, with one
// codec and checks each against proto.Unmarshal, and every earlier result
// again after each decode: from the third on, a message goes into an array
// an earlier one was in.
func FuzzListCodec(f *testing.F) {
	a := []*pluginapi.Device{{ID: "a", Health: pluginapi.Healthy}, {ID: "b", Health: pluginapi.Unhealthy,
		Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}}}
	b := []*pluginapi.Device{{ID: "a", Health: pluginapi.Unhealthy}, {ID: "b", Health: pluginapi.Unhealthy,
		Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}}}
	ra, _ := proto.Marshal(&pluginapi.ListAndWatchResponse{Devices: a})
	rb, _ := proto.Marshal(&pluginapi.ListAndWatchResponse{Devices: b})
	f.Add(ra, rb)
	f.Add(ra, ra[:len(ra)-1])
	f.Add([]byte{}, ra)
	f.Add([]byte{0x0a}, ra)
	f.Add(append(append([]byte{}, ra...), 0x0a), ra)
	f.Fuzz(func(t *testing.T, first, second []byte) {
		c := newListCodec()
		var raws [][]byte
		var got []*pluginapi.ListAndWatchResponse
		for _, raw := range [][]byte{first, second, first, second} {
			raws = append(raws, raw)
			got = append(got, decodeBoth(t, c, raw))
			for i, g := range got {
				if g == nil {
					continue // refused, as proto.Unmarshal refuses it
				}
				want := &pluginapi.ListAndWatchResponse{}
				require.NoError(t, proto.Unmarshal(raws[i], want))
				require.True(t, proto.Equal(want, g), "message %d changed after later ones were decoded", i)
			}
		}
	})
}

// Nothing the codec hands out points into the arrays it copies messages
// into and later reuses, nor into gRPC's buffers: every message decoded in
// a long sequence (health strings the API does not define, topologies too
// large to share, unknown fields in the message or in a device, which go to
// proto.Unmarshal) stays what proto.Unmarshal made of it.
func TestListCodecKeepsNothingOfItsArrays(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	c := newListCodec()
	type decoded struct {
		got, want *pluginapi.ListAndWatchResponse
	}
	var all []decoded
	for step := range 400 {
		devs := make([]*pluginapi.Device, rng.IntN(6))
		for i := range devs {
			d := &pluginapi.Device{
				ID:     fmt.Sprintf("id-%d-%d", step%3, i),
				Health: []string{pluginapi.Healthy, pluginapi.Unhealthy, fmt.Sprintf("h%d", step)}[rng.IntN(3)],
			}
			if rng.IntN(2) == 0 {
				nodes := make([]*pluginapi.NUMANode, 1+rng.IntN(30)) // some over maxTopologyBytes
				for j := range nodes {
					nodes[j] = &pluginapi.NUMANode{ID: int64(rng.IntN(3))}
				}
				d.Topology = &pluginapi.TopologyInfo{Nodes: nodes}
			}
			devs[i] = d
		}
		raw := marshal(t, devs)
		switch rng.IntN(4) {
		case 0: // an unknown field in the message: proto.Unmarshal for all of it
			raw = protowire.AppendBytes(protowire.AppendTag(raw, 9, protowire.BytesType), fmt.Appendf(nil, "junk%d", step))
		case 1: // an unknown field in a device: proto.Unmarshal for that device
			if len(devs) > 0 {
				b, err := proto.Marshal(devs[0])
				require.NoError(t, err)
				b = protowire.AppendBytes(protowire.AppendTag(b, 9, protowire.BytesType), fmt.Appendf(nil, "junk%d", step))
				raw = protowire.AppendBytes(protowire.AppendTag(raw, 1, protowire.BytesType), b)
			}
		}
		want := &pluginapi.ListAndWatchResponse{}
		require.NoError(t, proto.Unmarshal(raw, want))
		got := decodeBoth(t, c, raw)
		all = append(all, decoded{got, want})
		for i, d := range all {
			require.True(t, proto.Equal(d.want, d.got), "step %d: message %d changed", step, i)
		}
		for i := range raw {
			raw[i] = 0xee // gRPC reuses its buffers
		}
	}
}

// BenchmarkListCodec decodes a list of 10,000 GPU-style devices: the first
// message of a stream, and an update flipping 10% of their health, with the
// codec and with proto.Unmarshal.
func BenchmarkListCodec(b *testing.B) {
	devs := make([]*pluginapi.Device, 10000)
	flipped := make([]*pluginapi.Device, len(devs))
	for i := range devs {
		topo := &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(i % 2)}}}
		id := fmt.Sprintf("GPU-%08x-%04x-%04x-%04x-%012x", i, i, i, i, i)
		devs[i] = &pluginapi.Device{ID: id, Health: pluginapi.Healthy, Topology: topo}
		flipped[i] = devs[i]
		if i%10 == 0 {
			flipped[i] = &pluginapi.Device{ID: id, Health: pluginapi.Unhealthy, Topology: topo}
		}
	}
	raws := make([][]byte, 2)
	for i, l := range [][]*pluginapi.Device{devs, flipped} {
		var err error
		raws[i], err = proto.Marshal(&pluginapi.ListAndWatchResponse{Devices: l})
		if err != nil {
			b.Fatal(err)
		}
	}
	decode := func(b *testing.B, c *listCodec, raw []byte) {
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &pluginapi.ListAndWatchResponse{}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("first/codec", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			decode(b, newListCodec(), raws[0])
		}
	})
	b.Run("update/codec", func(b *testing.B) {
		c := newListCodec()
		decode(b, c, raws[0])
		b.ReportAllocs()
		i := 1
		for b.Loop() {
			decode(b, c, raws[i%2])
			i++
		}
	})
	for _, name := range []string{"first/proto", "update/proto"} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := proto.Unmarshal(raws[1], &pluginapi.ListAndWatchResponse{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// devicesOfEveryShape are devices whose encodings cover what decodeDevice
// reads: no field, each field alone, empty and several NUMA nodes, node 0,
// negative and large IDs, health strings the API does not define.
func devicesOfEveryShape() []*pluginapi.Device {
	node := func(ids ...int64) *pluginapi.TopologyInfo {
		t := &pluginapi.TopologyInfo{}
		for _, id := range ids {
			t.Nodes = append(t.Nodes, &pluginapi.NUMANode{ID: id})
		}
		return t
	}
	return []*pluginapi.Device{
		{},
		{ID: "GPU-0b3a8a5e-5c1f-4a39-9e5e-1d2f3a4b5c6d"},
		{Health: pluginapi.Healthy},
		{ID: "a", Health: pluginapi.Unhealthy, Topology: node()},
		{ID: "b", Health: "Unknown", Topology: node(0)},
		{ID: "c", Health: pluginapi.Healthy, Topology: node(0, 1, 63)},
		{ID: "d", Topology: node(-1, 1<<40)},
		{ID: "日本語", Health: "héalthy", Topology: node(7)},
	}
}

// Encodings as marshallers write them take decodeDevice's path and give
// what proto.Unmarshal gives.
// Decoded twice through one topology cache, a device gets the same
// *TopologyInfo the second time.
func TestDecodeDeviceMatchesProto(t *testing.T) {
	var cache topologyCache
	for i, want := range devicesOfEveryShape() {
		raw, err := proto.Marshal(want)
		require.NoError(t, err)
		got, again := &pluginapi.Device{}, &pluginapi.Device{}
		require.True(t, decodeDevice(raw, got, nil, ""), "device %d: %v", i, want)
		assert.True(t, proto.Equal(want, got), "device %d: got %v, want %v", i, got, want)
		require.True(t, decodeDevice(raw, got, &cache, ""), "device %d: %v", i, want)
		require.True(t, decodeDevice(raw, again, &cache, ""), "device %d: %v", i, want)
		assert.True(t, proto.Equal(want, again), "device %d: got %v, want %v", i, again, want)
		if want.Topology != nil {
			assert.Same(t, got.Topology, again.Topology, "device %d: the topology is shared", i)
		}
		// Given the ID it had before, a device keeps that string; given
		// another, it decodes its own.
		prev := strings.Clone(want.ID)
		same, other := &pluginapi.Device{}, &pluginapi.Device{}
		require.True(t, decodeDevice(raw, same, &cache, prev), "device %d: %v", i, want)
		require.True(t, decodeDevice(raw, other, &cache, prev+"x"), "device %d: %v", i, want)
		assert.True(t, proto.Equal(want, same) && proto.Equal(want, other), "device %d: got %v and %v, want %v", i, same, other, want)
		if len(want.ID) > 1 { // Go keeps one-byte strings in a static table
			assert.Same(t, unsafe.StringData(prev), unsafe.StringData(same.ID), "device %d: the ID is shared", i)
		}
	}
	// Anything else is left to proto.Unmarshal.
	ok := func(b []byte) bool { return decodeDevice(b, &pluginapi.Device{}, nil, "") }
	health := protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "Healthy")
	id := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "x")
	assert.False(t, ok(append(append([]byte{}, health...), id...)), "fields out of order")
	assert.False(t, ok(append(append([]byte{}, id...), id...)), "a field twice")
	assert.False(t, ok(protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.VarintType), 1)), "an unknown field")
	assert.False(t, ok(protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "\xff")), "invalid UTF-8")
	nodeWithMore := protowire.AppendVarint(protowire.AppendTag(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1), 2, protowire.VarintType), 5)
	topo := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), nodeWithMore)
	assert.False(t, ok(protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), topo)), "a NUMA node with another field")
}

// FuzzDecodeDevice: whenever decodeDevice accepts bytes, proto.Unmarshal
// accepts them too and decodes the same device.
func FuzzDecodeDevice(f *testing.F) {
	for _, d := range devicesOfEveryShape() {
		raw, err := proto.Marshal(d)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := &pluginapi.Device{}
		if !decodeDevice(b, got, nil, "") {
			return
		}
		want := &pluginapi.Device{}
		if err := proto.Unmarshal(b, want); err != nil {
			t.Fatalf("decodeDevice accepted what proto.Unmarshal refuses (%v): %x", err, b)
		}
		if !proto.Equal(want, got) {
			t.Fatalf("decodeDevice %v, proto.Unmarshal %v, from %x", got, want, b)
		}
		// Through a topology cache, the first decode and a shared second
		// one give the same device.
		var cache topologyCache
		for range 2 {
			shared := &pluginapi.Device{}
			if !decodeDevice(b, shared, &cache, "") || !proto.Equal(want, shared) {
				t.Fatalf("through the cache: %v, proto.Unmarshal %v, from %x", shared, want, b)
			}
		}
		// Given the previous ID, the same one or another, too.
		for _, prev := range []string{want.ID, want.ID + "x", "x"} {
			again := &pluginapi.Device{}
			if !decodeDevice(b, again, &cache, prev) || !proto.Equal(want, again) {
				t.Fatalf("with previous ID %q: %v, proto.Unmarshal %v, from %x", prev, again, want, b)
			}
		}
	})
}

// A list's devices share one *TopologyInfo per distinct encoding, up to
// maxTopologies encodings; past that, each device gets its own, and every
// device still decodes as proto.Unmarshal decodes it.
func TestListCodecSharesTopologies(t *testing.T) {
	const n = 300
	devs := make([]*pluginapi.Device, n)
	for i := range devs {
		// The first 200 devices on 2 layouts, then 100 layouts of their own.
		nodes := []*pluginapi.NUMANode{{ID: int64(i % 2)}}
		if i >= 200 {
			nodes = []*pluginapi.NUMANode{{ID: int64(i)}}
		}
		devs[i] = &pluginapi.Device{ID: fmt.Sprintf("dev-%03d", i), Health: pluginapi.Healthy,
			Topology: &pluginapi.TopologyInfo{Nodes: nodes}}
	}
	want := &pluginapi.ListAndWatchResponse{Devices: devs}
	raw, err := proto.Marshal(want)
	require.NoError(t, err)
	c := newListCodec()
	got := &pluginapi.ListAndWatchResponse{}
	require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, got))
	require.True(t, proto.Equal(want, got))
	distinct := map[*pluginapi.TopologyInfo]bool{}
	for _, d := range got.Devices {
		distinct[d.Topology] = true
	}
	assert.Same(t, got.Devices[0].Topology, got.Devices[198].Topology)
	assert.Same(t, got.Devices[1].Topology, got.Devices[199].Topology)
	assert.Len(t, c.topologies, maxTopologies, "the cache is bounded")
	assert.Len(t, distinct, 2+100, "one per layout, each of the last 100 its own")

	// A topology of many nodes is decoded, never kept.
	big := &pluginapi.TopologyInfo{}
	for i := range 100 {
		big.Nodes = append(big.Nodes, &pluginapi.NUMANode{ID: int64(i)})
	}
	want = &pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{{ID: "a", Topology: big}, {ID: "b", Topology: big}}}
	raw, err = proto.Marshal(want)
	require.NoError(t, err)
	c = newListCodec()
	got = &pluginapi.ListAndWatchResponse{}
	require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, got))
	require.True(t, proto.Equal(want, got))
	assert.Empty(t, c.topologies, "an encoding over maxTopologyBytes is not cached")
	assert.NotSame(t, got.Devices[0].Topology, got.Devices[1].Topology)
}

// Devices kept from older messages do not keep those messages' other
// devices alive. In a sequence where message k changes the devices from k
// on, device k stays as message k decoded it; the last device, replaced by
// every message, must be collectable once the next message replaces it
// (were each message's devices one array, device k would keep message k's
// last device alive). The first message, a whole new list, is one array by
// design and is left out.
func TestListCodecKeepsNoReplacedDevice(t *testing.T) {
	const n = 50
	devs := make([]*pluginapi.Device, n)
	for i := range devs {
		devs[i] = &pluginapi.Device{ID: fmt.Sprintf("GPU-%08x-aaaa-bbbb-cccc-%012d", i, i), Health: pluginapi.Healthy}
	}
	c := newListCodec()
	var last []weak.Pointer[pluginapi.Device]
	for k := range n {
		for j := k; j < n; j++ {
			h := pluginapi.Unhealthy
			if devs[j].Health == h {
				h = pluginapi.Healthy
			}
			devs[j] = &pluginapi.Device{ID: devs[j].ID, Health: h}
		}
		msg := &pluginapi.ListAndWatchResponse{}
		require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(marshal(t, devs))}, msg))
		if k > 0 {
			last = append(last, weak.Make(msg.Devices[n-1]))
		}
	}
	runtime.GC()
	kept := 0
	for _, p := range last[:len(last)-1] { // the newest is still the codec's
		if p.Value() != nil {
			kept++
		}
	}
	assert.Zero(t, kept, "replaced devices still reachable, of %d", len(last)-1)
	assert.NotNil(t, last[len(last)-1].Value(), "the codec's current device was collected")
	runtime.KeepAlive(c)
}

// The codec copies each message into one of two arrays it keeps, the one not
// holding the previous message; after very large messages, one small message
// is enough for it to keep nothing of theirs.
func TestListCodecMessageArrays(t *testing.T) {
	encode := func(n int) mem.BufferSlice {
		devs := make([]*pluginapi.Device, n)
		for i := range devs {
			devs[i] = &pluginapi.Device{ID: fmt.Sprintf("GPU-%08x-aaaa-bbbb-cccc-%012d", i, i), Health: pluginapi.Healthy}
		}
		raw, err := proto.Marshal(&pluginapi.ListAndWatchResponse{Devices: devs})
		require.NoError(t, err)
		// Two buffers, as gRPC hands a message that spans frames.
		return mem.BufferSlice{mem.SliceBuffer(raw[:len(raw)/2]), mem.SliceBuffer(raw[len(raw)/2:])}
	}
	c := newListCodec()
	decode := func(data mem.BufferSlice) []byte {
		msg := &pluginapi.ListAndWatchResponse{}
		require.NoError(t, c.Unmarshal(data, msg))
		require.Equal(t, data.Materialize(), c.prev, "the message kept for the next one")
		return c.prev
	}
	small := encode(100)
	a, b := decode(small), decode(small)
	assert.NotSame(t, &a[0], &b[0], "two messages in a row share an array")
	assert.Same(t, &a[0], &decode(small)[0], "the first array was not reused")

	large := encode(20000)
	decode(large)
	decode(large)
	require.Greater(t, cap(c.spans), 4*(100+minKeptBuffer/spanBytes), "the large message's spans")
	decode(small)
	for i, buf := range c.bufs {
		assert.LessOrEqual(t, cap(buf), 4*(len(small.Materialize())+minKeptBuffer), "array %d kept after a large message", i)
	}
	for name, spans := range map[string][]span{"spans": c.spans, "spare": c.spare} {
		assert.LessOrEqual(t, cap(spans), 4*(100+minKeptBuffer/spanBytes), "%s kept after a large message", name)
	}
	// The small message's arrays are kept: the next small one allocates none.
	prev := c.prev
	decode(small)
	assert.Same(t, &prev[0], &decode(small)[0], "an array was not reused")

	// A message that is not a device list in the usual form (here, with a
	// field the API does not have) is decoded by proto.Unmarshal; after a
	// large list it too leaves no array kept for the large one.
	decode(large)
	decode(large)
	odd := protowire.AppendVarint(protowire.AppendTag(small.Materialize(), 15, protowire.VarintType), 1)
	msg := &pluginapi.ListAndWatchResponse{}
	require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(odd)}, msg))
	require.Len(t, msg.Devices, 100)
	assert.Nil(t, c.prev, "nothing kept for the next message")
	for i, buf := range c.bufs {
		assert.LessOrEqual(t, cap(buf), 4*(len(odd)+minKeptBuffer), "array %d kept after a large message", i)
	}
	assert.LessOrEqual(t, cap(c.spare), 4*(minKeptBuffer/spanBytes), "spare spans kept after a large message")
}
