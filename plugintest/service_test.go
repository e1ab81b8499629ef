package plugintest

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestAllocateDefault(t *testing.T) {
	_, client := startPlugin(t, Options{
		Devices:       devices("dev-0", "dev-1"),
		CDIDeviceName: func(id string) string { return "example.com/gpu=" + id },
	})
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"dev-1", "dev-0"}},
		{},
	}}
	got, err := client.Allocate(testContext(t), req)
	require.NoError(t, err)

	want := &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{
		{
			Envs:        map[string]string{"PLUGINTEST_EXAMPLE_COM_GPU": "dev-0,dev-1"},
			Annotations: map[string]string{"plugintest/example.com_gpu": "dev-0,dev-1"},
			Devices: []*pluginapi.DeviceSpec{
				{ContainerPath: "/dev/plugintest/example.com_gpu/dev-0", HostPath: "/host/dev/plugintest/example.com_gpu/dev-0", Permissions: "rw"},
				{ContainerPath: "/dev/plugintest/example.com_gpu/dev-1", HostPath: "/host/dev/plugintest/example.com_gpu/dev-1", Permissions: "rw"},
			},
			Mounts: []*pluginapi.Mount{
				{ContainerPath: "/run/plugintest/example.com_gpu/dev-0", HostPath: "/host/run/plugintest/example.com_gpu/dev-0", ReadOnly: true},
				{ContainerPath: "/run/plugintest/example.com_gpu/dev-1", HostPath: "/host/run/plugintest/example.com_gpu/dev-1", ReadOnly: true},
			},
			CdiDevices: []*pluginapi.CDIDevice{{Name: "example.com/gpu=dev-0"}, {Name: "example.com/gpu=dev-1"}},
		},
		{},
	}}
	requireProtoEqual(t, want, got)
	assert.Equal(t, []string{"dev-1", "dev-0"}, req.GetContainerRequests()[0].GetDevicesIds(),
		"the caller's request must not be sorted in place")
}

func TestAllocateDefaultWithoutCDI(t *testing.T) {
	p, err := New(Options{ResourceName: "vendor-1.io/fpga.x"})
	require.NoError(t, err)
	got := p.DefaultAllocate(&pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"f"}},
	}})
	require.Len(t, got.GetContainerResponses(), 1)
	car := got.GetContainerResponses()[0]
	assert.Equal(t, map[string]string{"PLUGINTEST_VENDOR_1_IO_FPGA_X": "f"}, car.GetEnvs())
	assert.Empty(t, car.GetCdiDevices())
	require.Len(t, car.GetDevices(), 1)
	assert.Equal(t, "/dev/plugintest/vendor-1.io_fpga.x/f", car.GetDevices()[0].GetContainerPath())
}

func TestAllocateFunc(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a")})
	ctx := testContext(t)
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"a"}}}}

	p.SetAllocateFunc(func(ctx context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		resp := p.DefaultAllocate(r)
		resp.ContainerResponses[0].Envs["EXTRA"] = "1"
		return resp, nil
	})
	got, err := client.Allocate(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"PLUGINTEST_EXAMPLE_COM_GPU": "a", "EXTRA": "1"}, got.GetContainerResponses()[0].GetEnvs())

	p.SetAllocateFunc(func(ctx context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		return nil, status.Error(codes.ResourceExhausted, "no more")
	})
	_, err = client.Allocate(ctx, req)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))

	p.SetAllocateFunc(func(ctx context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		return nil, errors.New("plain")
	})
	_, err = client.Allocate(ctx, req)
	assert.Equal(t, codes.Unknown, status.Code(err))
	assert.Equal(t, "plain", status.Convert(err).Message())

	p.SetAllocateFunc(func(ctx context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		return nil, nil
	})
	got, err = client.Allocate(ctx, req)
	require.NoError(t, err)
	requireProtoEqual(t, &pluginapi.AllocateResponse{}, got)

	p.SetAllocateFunc(nil)
	got, err = client.Allocate(ctx, req)
	require.NoError(t, err)
	requireProtoEqual(t, p.DefaultAllocate(req), got)
}

func TestPreferredAllocationDefault(t *testing.T) {
	tests := []struct {
		name      string
		available []string
		must      []string
		size      int32
		want      []string
	}{
		{name: "sorted available up to size", available: []string{"d", "b", "a", "c"}, size: 2, want: []string{"a", "b"}},
		{name: "must-include first", available: []string{"a", "b", "c", "d"}, must: []string{"d", "c"}, size: 3, want: []string{"c", "d", "a"}},
		{name: "size above available", available: []string{"b", "a"}, size: 5, want: []string{"a", "b"}},
		{name: "must-include beyond size", available: []string{"a", "b"}, must: []string{"b", "a"}, size: 1, want: []string{"a", "b"}},
		{name: "duplicates dropped", available: []string{"a", "a", "b"}, must: []string{"b", "b"}, size: 2, want: []string{"b", "a"}},
		{name: "negative size", available: []string{"a"}, size: -1, want: []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, client := startPlugin(t, Options{GetPreferredAllocationAvailable: true})
			got, err := client.GetPreferredAllocation(testContext(t), &pluginapi.PreferredAllocationRequest{
				ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
					AvailableDeviceIDs:   tt.available,
					MustIncludeDeviceIDs: tt.must,
					AllocationSize:       tt.size,
				}},
			})
			require.NoError(t, err)
			require.Len(t, got.GetContainerResponses(), 1)
			assert.Equal(t, tt.want, append([]string{}, got.GetContainerResponses()[0].GetDeviceIDs()...))
		})
	}
}

func TestPreferredAllocationFunc(t *testing.T) {
	p, client := startPlugin(t, Options{})
	want := &pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{
		{DeviceIDs: []string{"device0", "device1", "device2"}},
	}}
	p.SetPreferredAllocationFunc(func(ctx context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
		return want, nil
	})
	got, err := client.GetPreferredAllocation(testContext(t), &pluginapi.PreferredAllocationRequest{})
	require.NoError(t, err)
	requireProtoEqual(t, want, got)

	p.SetPreferredAllocationFunc(nil)
	got, err = client.GetPreferredAllocation(testContext(t), &pluginapi.PreferredAllocationRequest{})
	require.NoError(t, err)
	requireProtoEqual(t, &pluginapi.PreferredAllocationResponse{}, got)
}

func TestPreStartContainer(t *testing.T) {
	p, client := startPlugin(t, Options{PreStartRequired: true})
	ctx := testContext(t)
	req := &pluginapi.PreStartContainerRequest{DevicesIds: []string{"a", "b"}}

	got, err := client.PreStartContainer(ctx, req)
	require.NoError(t, err)
	requireProtoEqual(t, &pluginapi.PreStartContainerResponse{}, got)

	p.SetPreStartFunc(func(ctx context.Context, r *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
		return nil, status.Errorf(codes.FailedPrecondition, "device %s not ready", r.GetDevicesIds()[0])
	})
	_, err = client.PreStartContainer(ctx, req)
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	assert.Equal(t, "device a not ready", status.Convert(err).Message())

	p.SetPreStartFunc(nil)
	_, err = client.PreStartContainer(ctx, req)
	require.NoError(t, err)

	calls := p.CallsOf(MethodPreStartContainer)
	require.Len(t, calls, 3)
	requireProtoEqual(t, req, calls[2].Request)
}

// Allocate refuses a device the plugin never listed, as a real plugin does
// (sanity's allocate/unknown-device), and allocates those it listed once,
// even after an Update dropped them: a kubelet may allocate from the list it
// had.
func TestAllocateRefusesUnlistedDevices(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a", "b")})
	ctx := testContext(t)
	allocate := func(ids ...string) error {
		_, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: ids[:1]}, {DevicesIds: ids[1:]},
		}})
		return err
	}
	require.NoError(t, allocate("a", "b"))
	err := allocate("a", "b", "x", "y")
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), `["x" "y"]`)

	p.Update(devices("c"))
	require.NoError(t, allocate("a", "c"))
	assert.Equal(t, codes.InvalidArgument, status.Code(allocate("c", "d")))
	assert.Len(t, p.CallsOf(MethodAllocate), 4, "refused calls are recorded too")
}
