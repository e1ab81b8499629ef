package plugintest_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
)

// Example starts a plugin with two devices, connects to it as the kubelet
// would, and reads the device list from the first ListAndWatch message.
func Example() {
	dir, err := os.MkdirTemp("", "pt") // short: a socket path must fit in 108 bytes
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)

	p, err := plugintest.New(plugintest.Options{
		ResourceName: "example.com/gpu",
		SocketDir:    dir,
		Devices: []*pluginapi.Device{
			{ID: "gpu-0", Health: pluginapi.Healthy},
			{ID: "gpu-1", Health: pluginapi.Unhealthy},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Stop()
	if err := p.Start(); err != nil {
		fmt.Println(err)
		return
	}

	conn, err := grpc.NewClient("unix://"+p.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		fmt.Println(err)
		return
	}
	msg, err := stream.Recv()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range msg.GetDevices() {
		fmt.Println(d.GetID(), d.GetHealth())
	}
	// Output:
	// gpu-0 Healthy
	// gpu-1 Unhealthy
}
