package devicemanager

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// goSource is a device source written in Go: it lists the devices it is
// given, sends every list put on lists, and answers Allocate with one
// variable naming the devices and one device node per device.
type goSource struct {
	pluginapi.UnimplementedDevicePluginServer
	devs  []*pluginapi.Device
	lists chan []*pluginapi.Device
}

func newGoSource(devs ...*pluginapi.Device) *goSource {
	return &goSource{devs: devs, lists: make(chan []*pluginapi.Device)}
}

func (s *goSource) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (s *goSource) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	list := s.devs
	for {
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: list}); err != nil {
			return err
		}
		select {
		case list = <-s.lists:
		case <-stream.Context().Done():
			return nil
		}
	}
}

func (s *goSource) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		cr := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"GO_DEVICES": strings.Join(c.DevicesIds, ",")}}
		for _, id := range c.DevicesIds {
			cr.Devices = append(cr.Devices, &pluginapi.DeviceSpec{HostPath: "/dev/" + id, ContainerPath: "/dev/" + id, Permissions: "rw"})
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cr)
	}
	return resp, nil
}

// send puts a new device list on the source's stream.
func (s *goSource) send(t *testing.T, devs ...*pluginapi.Device) {
	t.Helper()
	select {
	case s.lists <- devs:
	case <-t.Context().Done():
		t.Fatal("the stream did not take the list")
	}
}

// registerLocal registers src for res and waits for its whole device list.
func (h *harness) registerLocal(res string, src *goSource) (stop func()) {
	h.t.Helper()
	stop, err := h.m.RegisterLocal(res, src, nil)
	require.NoError(h.t, err)
	h.t.Cleanup(stop)
	h.waitCapacity(res, int64(len(src.devs)), int64(countHealthy(src.devs)))
	return stop
}

// A Go device source is a resource like a plugin's: its devices count in
// capacity, Allocate gets its answer, and Status names it local.
func TestRegisterLocalServesCapacityAndAllocate(t *testing.T) {
	h := newHarness(t).start()
	h.registerLocal(res1, newGoSource(dev("a", pluginapi.Healthy), dev("b", pluginapi.Healthy), dev("c", pluginapi.Unhealthy)))

	pod := newPod("p", ctr("app", res1, 2))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	assert.Equal(t, []string{"a", "b"}, h.held(pod, "app", res1))
	opts, err := h.m.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
	require.NoError(t, err)
	assert.Equal(t, []EnvVar{{Name: "GO_DEVICES", Value: "a,b"}}, opts.Envs)
	assert.Equal(t, []DeviceInfo{
		{PathOnHost: "/dev/a", PathInContainer: "/dev/a", Permissions: "rw"},
		{PathOnHost: "/dev/b", PathInContainer: "/dev/b", Permissions: "rw"},
	}, opts.Devices)

	st := h.m.Status()
	require.Len(t, st, 1)
	assert.Equal(t, []EndpointStatus{{Resource: res1, Socket: "local:" + res1}}, st[0].Endpoints)
	assert.Equal(t, [2]int{2, 0}, [2]int{st[0].Allocated, st[0].Free}, "both healthy devices are held")
}

// Options given to RegisterLocal are used instead of the server's.
func TestRegisterLocalGivenOptions(t *testing.T) {
	h := newHarness(t).start()
	_, err := h.m.RegisterLocal(res1, newGoSource(dev("a", pluginapi.Healthy)),
		&pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true})
	require.NoError(t, err)
	h.waitCapacity(res1, 1, 1)
	st := h.m.Status()
	require.Len(t, st, 1)
	assert.Equal(t, []EndpointStatus{{Resource: res1, Socket: "local:" + res1, GetPreferredAllocationAvailable: true}}, st[0].Endpoints)
}

// Health sent on the source's stream reaches capacity, and the owners of
// the devices whose health changed are named on Updates.
func TestRegisterLocalHealthReachesCapacityAndUpdates(t *testing.T) {
	h := newHarness(t).start()
	src := newGoSource(dev("a", pluginapi.Healthy), dev("b", pluginapi.Healthy))
	h.registerLocal(res1, src)
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	held := h.held(pod, "app", res1)
	require.Len(t, held, 1)

	other := "a"
	if held[0] == "a" {
		other = "b"
	}
	src.send(t, dev(held[0], pluginapi.Unhealthy), dev(other, pluginapi.Healthy))
	h.waitCapacity(res1, 2, 1)
	select {
	case u := <-h.m.Updates():
		assert.Equal(t, []string{"p"}, u.PodUIDs)
	case <-h.waitCtx().Done():
		t.Fatal("no update for the pod whose device became unhealthy")
	}
}

// The checkpoint records what a local resource allocated; a restarted
// manager restores it, and the source registers again.
func TestRegisterLocalCheckpoint(t *testing.T) {
	h := newHarness(t).start()
	h.registerLocal(res1, newGoSource(dev("a", pluginapi.Healthy), dev("b", pluginapi.Healthy)))
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	held := h.held(pod, "app", res1)
	require.Len(t, held, 1)

	h.restart(nil, nil)
	assert.Equal(t, held, h.held(pod, "app", res1), "restored from the checkpoint")
	h.registerLocal(res1, newGoSource(dev("a", pluginapi.Healthy), dev("b", pluginapi.Healthy)))
	assert.Equal(t, held, h.held(pod, "app", res1))
	st := h.m.Status()
	require.Len(t, st, 1)
	assert.Equal(t, 1, st[0].Free, "the restored allocation holds its device")
}

// stop makes the resource unhealthy at once and removes it after the grace
// period; the allocation stays, and the resource may register again.
func TestRegisterLocalStop(t *testing.T) {
	h := newHarness(t).start()
	stop := h.registerLocal(res1, newGoSource(dev("a", pluginapi.Healthy), dev("b", pluginapi.Healthy)))
	pod := newPod("p", ctr("app", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))

	stop()
	c, a := h.capacity(res1)
	assert.Equal(t, [2]int64{2, 0}, [2]int64{c, a}, "unhealthy once stop returns")
	st := h.m.Status()
	require.Len(t, st, 1)
	assert.Equal(t, []EndpointStatus{{Resource: res1, Socket: "local:" + res1, Stopped: true}}, st[0].Endpoints)
	stop() // idempotent

	h.clock.Step(h.m.opts.StopGracePeriod)
	c, _ = h.capacity(res1)
	assert.Equal(t, int64(2), c, "still there at the end of the grace period")
	h.clock.Step(1)
	c, _ = h.capacity(res1)
	assert.Equal(t, int64(-1), c, "removed after the grace period")
	assert.Len(t, h.held(pod, "app", res1), 1, "the allocation stays")

	h.registerLocal(res1, newGoSource(dev("a", pluginapi.Healthy)))
}

// RegisterLocal refuses before Start, after Stop, a bad name, a nil server,
// a resource already registered locally, and registrations over the limits.
func TestRegisterLocalRefuses(t *testing.T) {
	t.Run("before Start and after Stop", func(t *testing.T) {
		h := newHarness(t)
		_, err := h.m.RegisterLocal(res1, newGoSource(), nil)
		require.ErrorIs(t, err, ErrStopped)
		h.start()
		require.NoError(t, h.m.Stop())
		_, err = h.m.RegisterLocal(res1, newGoSource(), nil)
		require.ErrorIs(t, err, ErrStopped)
	})
	t.Run("bad input", func(t *testing.T) {
		h := newHarness(t).start()
		for _, name := range []string{"", "nodomain", "kubernetes.io/gpu", "requests.example.com/gpu", "example.com/bad name"} {
			_, err := h.m.RegisterLocal(name, newGoSource(), nil)
			require.ErrorContains(t, err, "is invalid", "name %q", name)
		}
		_, err := h.m.RegisterLocal(res1, nil, nil)
		require.ErrorContains(t, err, "nil device plugin server")
		h.registerLocal(res1, newGoSource(dev("a", pluginapi.Healthy)))
		_, err = h.m.RegisterLocal(res1, newGoSource(), nil)
		require.ErrorContains(t, err, "already registered locally")
		assert.Equal(t, pluginapi.Healthy, h.m.Status()[0].Devices[0].Health, "the first source still serves")
	})
	t.Run("MaxResources", func(t *testing.T) {
		h := newHarness(t, func(o *Options) { o.MaxResources = 1 }).start()
		h.registerLocal(res1, newGoSource(dev("a", pluginapi.Healthy)))
		_, err := h.m.RegisterLocal(res2, newGoSource(dev("b", pluginapi.Healthy)), nil)
		require.ErrorIs(t, err, ErrPluginLimit)
		assert.Equal(t, int64(-1), func() int64 { c, _ := h.capacity(res2); return c }())
	})
	t.Run("MaxInstancesPerResource", func(t *testing.T) {
		h := newHarness(t, func(o *Options) { o.MaxInstancesPerResource = 1 }).start()
		h.registered(res1, devices("p", 1))
		_, err := h.m.RegisterLocal(res1, newGoSource(dev("a", pluginapi.Healthy)), nil)
		require.ErrorIs(t, err, ErrPluginLimit)
		h.waitCapacity(res1, 1, 1)
	})
}

// Stop ends every local source's server and stream; goleak in TestMain
// finds any goroutine left. The source's stream sees its context end.
func TestRegisterLocalStoppedByStop(t *testing.T) {
	h := newHarness(t).start()
	src := newGoSource(dev("a", pluginapi.Healthy))
	h.registerLocal(res1, src)
	require.NoError(t, h.m.Stop())
	c, a := h.capacity(res1)
	assert.Equal(t, [2]int64{1, 0}, [2]int64{c, a})
	st := h.m.Status()
	require.Len(t, st, 1)
	assert.True(t, st[0].Endpoints[0].Stopped)
}

// slowOptionsSource is a goSource whose GetDevicePluginOptions waits for
// release, after closing asked.
type slowOptionsSource struct {
	*goSource
	asked, release chan struct{}
}

func (s *slowOptionsSource) GetDevicePluginOptions(ctx context.Context, e *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	close(s.asked)
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.goSource.GetDevicePluginOptions(ctx, e)
}

// Of two concurrent registrations of one resource, the second is refused
// as one made after the first would be: the first is not replaced without
// its caller knowing.
func TestRegisterLocalConcurrentRegistrationRefused(t *testing.T) {
	leaks := newLeakCheck(t)
	h := newHarness(t).start()
	first := &slowOptionsSource{goSource: newGoSource(dev("a", pluginapi.Healthy)),
		asked: make(chan struct{}), release: make(chan struct{})}
	type result struct {
		stop func()
		err  error
	}
	registered := make(chan result, 1)
	go func() {
		stop, err := h.m.RegisterLocal(res1, first, nil)
		registered <- result{stop, err}
	}()
	select {
	case <-first.asked:
	case <-time.After(waitTimeout):
		t.Fatal("the first registration did not ask for the options")
	}

	stop, err := h.m.RegisterLocal(res1, newGoSource(dev("b", pluginapi.Healthy)), nil)
	if stop != nil {
		t.Cleanup(stop)
	}
	require.ErrorContains(t, err, "already registered locally", "while the first is connecting")

	close(first.release)
	var r result
	select {
	case r = <-registered:
	case <-time.After(waitTimeout):
		t.Fatal("the first registration did not return")
	}
	require.NoError(t, r.err)
	h.waitCapacity(res1, 1, 1)
	assert.Equal(t, "a", h.m.Status()[0].Devices[0].ID, "the first source serves")
	r.stop()
	r.stop()
	require.NoError(t, h.m.Stop())
	leaks.verify()
}
