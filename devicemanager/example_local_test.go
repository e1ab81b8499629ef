package devicemanager_test

import (
	"context"
	"fmt"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
)

// fpgaSource is an agent's own device source: two FPGAs it found itself,
// served to the manager without a socket or a plugin process.
type fpgaSource struct {
	pluginapi.UnimplementedDevicePluginServer
}

func (fpgaSource) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the list once, then waits for the manager to hang up.
func (fpgaSource) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{
		{ID: "fpga-0", Health: pluginapi.Healthy}, {ID: "fpga-1", Health: pluginapi.Healthy},
	}})
	if err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (fpgaSource) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"FPGA": c.DevicesIds[0]},
		})
	}
	return resp, nil
}

// An agent that discovers devices itself registers them with RegisterLocal
// and admits a pod; capacity, health and the checkpoint work as for a
// plugin's resource.
func ExampleManagerImpl_RegisterLocal() {
	dir, _ := os.MkdirTemp("", "dm")
	defer os.RemoveAll(dir)
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "default", UID: "uid-job"},
		Spec: v1.PodSpec{Containers: []v1.Container{{
			Name:      "app",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"example.com/fpga": resource.MustParse("1")}},
		}}},
	}
	// Allocate waits up to a minute for the source's first device list.
	mgr, _ := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir, PluginWaitTimeout: time.Minute})
	_ = mgr.Start(func() []*v1.Pod { return []*v1.Pod{pod} }, nil, nil, nil)
	defer mgr.Stop()

	stop, err := mgr.RegisterLocal("example.com/fpga", fpgaSource{}, nil)
	if err != nil {
		panic(err)
	}
	defer stop()
	ctx := context.Background()
	if err := mgr.Allocate(ctx, pod, &pod.Spec.Containers[0]); err != nil {
		panic(err)
	}
	capacity, allocatable, _ := mgr.GetCapacity()
	fmt.Println("capacity:", capacity.Name("example.com/fpga", resource.DecimalSI),
		"allocatable:", allocatable.Name("example.com/fpga", resource.DecimalSI))
	opts, _ := mgr.GetDeviceRunContainerOptions(ctx, pod, &pod.Spec.Containers[0])
	fmt.Println("env:", opts.Envs)
	fmt.Println("instance:", mgr.Status()[0].Endpoints[0].Socket)
	// Output:
	// capacity: 2 allocatable: 2
	// env: [{FPGA fpga-0}]
	// instance: local:example.com/fpga
}
