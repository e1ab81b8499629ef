package plugintest

import (
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// sizeCodec is a client codec that keeps only the size of what it receives,
// so that a benchmark times the plugin's side and the transfer.
type sizeCodec struct{}

func (sizeCodec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2(grpcproto.Name).Marshal(v)
}

func (sizeCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*int) = data.Len()
	return nil
}

func (sizeCodec) Name() string { return grpcproto.Name }

// BenchmarkUpdateReceived times Update of 10,000 GPU-style devices, 10% of
// them changing health each time, until one ListAndWatch client has received
// the message whole.
func BenchmarkUpdateReceived(b *testing.B) {
	lists := [2][]*pluginapi.Device{gpuDevices(10000, 0), gpuDevices(10000, 10)}
	p, err := New(Options{ResourceName: testResource, SocketDir: b.TempDir(), Devices: lists[0]})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Stop)
	if err := p.Start(); err != nil {
		b.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+p.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	desc := &grpc.StreamDesc{StreamName: "ListAndWatch", ServerStreams: true}
	stream, err := conn.NewStream(b.Context(), desc, "/v1beta1.DevicePlugin/ListAndWatch", grpc.ForceCodecV2(sizeCodec{}))
	if err != nil {
		b.Fatal(err)
	}
	if err := stream.SendMsg(&pluginapi.Empty{}); err != nil {
		b.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		b.Fatal(err)
	}
	var size int
	if err := stream.RecvMsg(&size); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		p.Update(lists[i%2])
		if err := stream.RecvMsg(&size); err != nil || size < 500000 {
			b.Fatalf("received %d bytes: %v", size, err)
		}
	}
}

// BenchmarkDevices copies a list of 10,000 GPU-style devices out of the
// plugin.
func BenchmarkDevices(b *testing.B) {
	devs := gpuDevices(10000, 0)
	p, err := New(Options{ResourceName: testResource, Devices: devs})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if len(p.Devices()) != len(devs) {
			b.Fatal("short copy")
		}
	}
}

// gpuDevices makes n GPU-style devices on NUMA nodes 0 and 1 alternately;
// every unhealthyEvery-th one, from the first, is Unhealthy (0: none).
func gpuDevices(n, unhealthyEvery int) []*pluginapi.Device {
	devs := make([]*pluginapi.Device, n)
	for i := range devs {
		health := pluginapi.Healthy
		if unhealthyEvery > 0 && i%unhealthyEvery == 0 {
			health = pluginapi.Unhealthy
		}
		devs[i] = &pluginapi.Device{
			ID:       fmt.Sprintf("GPU-%08x-%04x-%04x-%04x-%012x", i, i, i, i, i),
			Health:   health,
			Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(i % 2)}}},
		}
	}
	return devs
}
