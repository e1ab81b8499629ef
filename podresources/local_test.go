package podresources_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/openkubelet/devmgr/podresources"
)

// localSource is a device source in Go, registered with RegisterLocal.
type localSource struct {
	pluginapi.UnimplementedDevicePluginServer
	devs []*pluginapi.Device
}

func (s localSource) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (s localSource) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: s.devs}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (s localSource) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return resp, nil
}

// A resource whose devices come from Go code (RegisterLocal) is reported as
// a plugin's: its devices with their NUMA nodes, and what each container holds.
func TestLocalResourceIsReported(t *testing.T) {
	const fpga = "example.com/fpga"
	n := newNode(t)
	stop, err := n.mgr.RegisterLocal(fpga, localSource{devs: []*pluginapi.Device{device("fpga-0", 0), device("fpga-1", 1)}}, nil)
	require.NoError(t, err)
	t.Cleanup(stop)
	n.waitAllocatable(fpga, "fpga-0", "fpga-1")
	n.admit(pod("default", "job", "uid-job", nil, container("app", map[string]int64{fpga: 2})))
	_, client := n.serve(podresources.Options{})
	ctx := callCtx(t)

	list, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	require.NoError(t, err)
	assertProto(t, &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		podRes("default", "job", ctr("app", dev(fpga, "fpga-0", 0), dev(fpga, "fpga-1", 1))),
	}}, list, "List")

	alloc, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	require.NoError(t, err)
	assertProto(t, &podresourcesv1.AllocatableResourcesResponse{
		Devices: []*podresourcesv1.ContainerDevices{dev(fpga, "fpga-0", 0), dev(fpga, "fpga-1", 1)},
	}, alloc, "GetAllocatableResources")
}
