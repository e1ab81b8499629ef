package devicemanager

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
)

func TestStatus(t *testing.T) {
	h := newHarness(t)
	assert.Empty(t, h.m.Status(), "before Start")
	h.start()
	p := h.registered(res1, []*pluginapi.Device{
		dev("b", pluginapi.Healthy, 1), dev("a", pluginapi.Healthy, 0), dev("c", pluginapi.Unhealthy),
	}, func(o *plugintest.Options) { o.Endpoint = "r1.sock"; o.PreStartRequired = true })
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))

	want := ResourceStatus{
		Name: res1, Capacity: 3, Allocatable: 2, Allocated: 1, Free: 1,
		Devices: []DeviceStatus{
			{ID: "a", Health: pluginapi.Healthy, NUMANodes: []int64{0}, Allocated: true},
			{ID: "b", Health: pluginapi.Healthy, NUMANodes: []int64{1}},
			{ID: "c", Health: pluginapi.Unhealthy},
		},
		Endpoints: []EndpointStatus{{Resource: res1, Socket: p.SocketPath(), PreStartRequired: true}},
	}
	assert.Equal(t, []ResourceStatus{want}, h.m.Status())

	p.CloseStreams()
	h.waitCapacity(res1, 3, 0)
	got := h.m.Status()
	require.Len(t, got, 1)
	assert.Equal(t, 0, got[0].Allocatable)
	assert.Equal(t, 0, got[0].Free)
	assert.Equal(t, pluginapi.Unhealthy, got[0].Devices[0].Health, "the plugin is gone")
	assert.Equal(t, []EndpointStatus{{Resource: res1, Socket: p.SocketPath(), PreStartRequired: true, Stopped: true}}, got[0].Endpoints)

	h.restart(nil, nil)
	got = h.m.Status()
	require.Len(t, got, 1)
	assert.True(t, got[0].RestoredFromCheckpoint)
	assert.Equal(t, 1, got[0].Allocated)
	assert.Equal(t, []EndpointStatus{{Resource: res1, Stopped: true}}, got[0].Endpoints)
}

// TestStatusFollowsNewIDs: Status lists the devices of the latest list in ID
// order, after lists that change the set of IDs and after a health flip.
func TestStatusFollowsNewIDs(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, []*pluginapi.Device{dev("b", pluginapi.Healthy), dev("a", pluginapi.Healthy)})
	ids := func() []string {
		var out []string
		for _, d := range h.m.Status()[0].Devices {
			out = append(out, d.ID+"/"+d.Health)
		}
		return out
	}
	assert.Equal(t, []string{"a/Healthy", "b/Healthy"}, ids())

	p.Update([]*pluginapi.Device{dev("d", pluginapi.Healthy), dev("c", pluginapi.Unhealthy), dev("a", pluginapi.Healthy)})
	h.waitCapacity(res1, 3, 2)
	assert.Equal(t, []string{"a/Healthy", "c/Unhealthy", "d/Healthy"}, ids())

	p.Update([]*pluginapi.Device{dev("d", pluginapi.Unhealthy), dev("c", pluginapi.Unhealthy), dev("a", pluginapi.Healthy)})
	h.waitCapacity(res1, 3, 1)
	assert.Equal(t, []string{"a/Healthy", "c/Unhealthy", "d/Unhealthy"}, ids())
}
