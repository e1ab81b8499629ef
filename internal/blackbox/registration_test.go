package blackbox_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
)

// Only v1beta1 is accepted, with the kubelet's message.
func TestRegisterRejectsUnsupportedVersion(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	p := newFakePlugin(t, e.dir, "p.sock", resGPU, nil, healthy("d0"))
	p.start(t)
	for _, v := range []string{"v1alpha", "v1", "", "v1beta2"} {
		err := register(t, e.dir, &pluginapi.RegisterRequest{Version: v, Endpoint: p.endpointName(), ResourceName: resGPU})
		require.Error(t, err, "version %q", v)
		want := fmt.Sprintf(`requested API version %q is not supported by kubelet. Supported version is ["v1beta1"]`, v)
		assert.Contains(t, status.Convert(err).Message(), want)
	}
	assert.Equal(t, 0, p.optionCalls(), "a rejected registration dialled the plugin")
	_, _, listed := capacityOf(e.mgr, resGPU)
	assert.False(t, listed)
}

// The resource name must be an extended resource name, by the kubelet's
// rules: a domain outside kubernetes.io, not "requests.", a valid
// qualified name.
func TestRegisterResourceNameRules(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	longPrefixOK := strings.Repeat("a", 244)  // "requests." + 244 = 253
	longPrefixBad := strings.Repeat("a", 245) // 254
	cases := []struct {
		name  string
		valid bool
	}{
		{"vendor.com/gpu", true},
		{"a/b", true},
		{"example.com/a_b.c-D9", true},
		{"x.io/" + strings.Repeat("n", 63), true},
		{longPrefixOK + "/g", true},
		{"gpu", false},
		{"kubernetes.io/gpu", false},
		{"foo.kubernetes.io/gpu", false},
		{"requests.vendor.com/gpu", false},
		{"Vendor.com/gpu", false},
		{"vendor_com/gpu", false},
		{"vendor.com/gpu/x", false},
		{"vendor.com/", false},
		{"/gpu", false},
		{"vendor.com/-gpu", false},
		{"vendor.com/gpu-", false},
		{"vendor.com/g pu", false},
		{"x.io/" + strings.Repeat("n", 64), false},
		{longPrefixBad + "/g", false},
	}
	for i, tc := range cases {
		t.Run(fmt.Sprintf("%d-%v", i, tc.valid), func(t *testing.T) {
			p := newFakePlugin(t, e.dir, fmt.Sprintf("n%d.sock", i), tc.name, nil, healthy("d0"))
			p.start(t)
			err := registerPlugin(t, e.dir, p)
			if tc.valid {
				require.NoError(t, err, "name %q", tc.name)
				e.waitCapacity(t, tc.name, 1, 1)
				return
			}
			require.Error(t, err, "name %q", tc.name)
			assert.Contains(t, status.Convert(err).Message(), fmt.Sprintf("the ResourceName %q is invalid", tc.name))
			assert.Equal(t, 0, p.optionCalls())
		})
	}
}

// RegisterRequest.Endpoint must be a bare file name, even when the path it
// names holds a serving plugin (the kubelet joins it to the socket directory
// unchecked, so ".." leaves the directory).
func TestRegisterEndpointMustBeBareFileName(t *testing.T) {
	root := tempDir(t)
	sockDir := filepath.Join(root, "dp")
	e := newEnv(t, func(o *devicemanager.Options) { o.SocketDir = sockDir })
	e.dir = sockDir
	e.start(t)
	require.NoError(t, os.Mkdir(filepath.Join(sockDir, "sub"), 0o750))

	outside := newFakePlugin(t, root, "x.sock", resGPU, nil, healthy("d0"))
	outside.start(t)
	nested := newFakePlugin(t, filepath.Join(sockDir, "sub"), "y.sock", resGPU, nil, healthy("d0"))
	nested.start(t)

	for _, ep := range []string{"../x.sock", "sub/y.sock", "./sub/y.sock", outside.sock, "", ".", ".."} {
		err := register(t, sockDir, &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: ep, ResourceName: resGPU})
		assert.Error(t, err, "endpoint %q accepted", ep)
	}
	assert.Equal(t, 0, outside.optionCalls(), "plugin outside SocketDir was dialled")
	assert.Equal(t, 0, nested.optionCalls(), "plugin in a subdirectory was dialled")
	_, _, listed := capacityOf(e.mgr, resGPU)
	assert.False(t, listed)
}

// RegisterRequest.Options is ignored, as by the kubelet: the options come
// from GetDevicePluginOptions.
func TestRegisterOptionsFetchedByRPC(t *testing.T) {
	t.Run("request says yes, plugin says no", func(t *testing.T) {
		e := newEnv(t, nil)
		e.start(t)
		p := newFakePlugin(t, e.dir, "p.sock", resGPU, &pluginapi.DevicePluginOptions{}, healthy("d0"), healthy("d1"), healthy("d2"))
		p.start(t)
		require.NoError(t, register(t, e.dir, &pluginapi.RegisterRequest{
			Version: pluginapi.Version, Endpoint: p.endpointName(), ResourceName: resGPU,
			Options: &pluginapi.DevicePluginOptions{PreStartRequired: true, GetPreferredAllocationAvailable: true},
		}))
		e.waitCapacity(t, resGPU, 3, 3)
		assert.GreaterOrEqual(t, p.optionCalls(), 1)
		pd := pod("u1", ctr("c", resGPU, 1))
		e.pods.set(pd)
		require.NoError(t, e.mgr.Allocate(context.Background(), pd, &pd.Spec.Containers[0]))
		_, err := e.mgr.GetDeviceRunContainerOptions(context.Background(), pd, &pd.Spec.Containers[0])
		require.NoError(t, err)
		assert.Empty(t, p.preferredCalls())
		assert.Empty(t, p.preStartCalls())
	})
	t.Run("request says nothing, plugin says yes", func(t *testing.T) {
		e := newEnv(t, nil)
		e.start(t)
		p := newFakePlugin(t, e.dir, "p.sock", resGPU,
			&pluginapi.DevicePluginOptions{PreStartRequired: true, GetPreferredAllocationAvailable: true},
			healthy("d0"), healthy("d1"), healthy("d2"))
		p.start(t)
		require.NoError(t, register(t, e.dir, &pluginapi.RegisterRequest{
			Version: pluginapi.Version, Endpoint: p.endpointName(), ResourceName: resGPU,
		}))
		e.waitCapacity(t, resGPU, 3, 3)
		pd := pod("u1", ctr("c", resGPU, 1))
		e.pods.set(pd)
		require.NoError(t, e.mgr.Allocate(context.Background(), pd, &pd.Spec.Containers[0]))
		_, err := e.mgr.GetDeviceRunContainerOptions(context.Background(), pd, &pd.Spec.Containers[0])
		require.NoError(t, err)
		assert.Len(t, p.preferredCalls(), 1)
		assert.Len(t, p.preStartCalls(), 1)
	})
}

// A failed dial-back is returned to the registering plugin.
func TestRegisterFailsWhenPluginNotServing(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	err := register(t, e.dir, &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "nobody.sock", ResourceName: resGPU})
	require.Error(t, err)
	_, _, listed := capacityOf(e.mgr, resGPU)
	assert.False(t, listed)

	// A later, good registration of the same resource works.
	e.plugin(t, "p.sock", resGPU, nil, healthy("d0"))
}

// Re-registering on the same socket replaces the old connection (the
// kubelet refuses it); the old stream's end must not stop the live
// endpoint.
func TestReRegisterSameSocketReplacesConnection(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	p := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	require.Eventually(t, func() bool { return p.streamCount() == 1 }, waitFor, tick)

	require.NoError(t, registerPlugin(t, e.dir, p), "re-registration on the same socket refused")
	require.Eventually(t, func() bool { return p.streamCount() == 2 }, waitFor, tick)
	require.Eventually(t, func() bool { return p.openStreams() == 1 }, waitFor, tick, "old connection not closed")

	p.update(healthy("d0"), healthy("d1"), healthy("d2"))
	e.waitCapacity(t, resGPU, 3, 3)
	// The old stream ended; if that had stopped the endpoint, the grace
	// period would now remove the live resource.
	e.clock.Step(10 * time.Minute)
	c, a, listed := capacityOf(e.mgr, resGPU)
	assert.True(t, listed, "live resource removed after the old connection ended")
	assert.Equal(t, int64(3), c)
	assert.Equal(t, int64(3), a)
}

// A plugin restarted on the same socket path is accepted and its list wins.
func TestPluginRestartOnSameSocket(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	p := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	p.stop()
	e.waitCapacity(t, resGPU, 2, 0)

	p2 := e.plugin(t, "p.sock", resGPU, nil, healthy("d5"))
	e.clock.Step(6 * time.Minute)
	c, a, listed := capacityOf(e.mgr, resGPU)
	assert.True(t, listed)
	assert.Equal(t, int64(1), c)
	assert.Equal(t, int64(1), a)
	assert.Equal(t, []string{"d5"}, keys(e.mgr.GetAllocatableDevices()[resGPU]))

	pd := pod("u1", ctr("c", resGPU, 1))
	require.NoError(t, e.mgr.Allocate(context.Background(), pd, &pd.Spec.Containers[0]))
	assert.Len(t, p2.allocateCalls(), 1)
}

// Several instances of one resource on different sockets: the newest is the
// one called, the latest full list wins, and losing one keeps the
// resource.
func TestMultipleInstancesLatestListWins(t *testing.T) {
	for _, opts := range []*pluginapi.DevicePluginOptions{
		{}, {PreStartRequired: true}, {GetPreferredAllocationAvailable: true},
		{PreStartRequired: true, GetPreferredAllocationAvailable: true},
	} {
		t.Run(fmt.Sprintf("prestart=%v,preferred=%v", opts.PreStartRequired, opts.GetPreferredAllocationAvailable), func(t *testing.T) {
			e := newEnv(t, nil)
			e.start(t)
			a := e.plugin(t, "p.sock", resGPU, opts, healthy("Dev1"), healthy("Dev2"))
			b := e.plugin(t, "p.sock.new", resGPU, opts, healthy("Dev1"), healthy("Dev2"), healthy("Dev4"))
			c := e.plugin(t, "p.sock.third", resGPU, opts, healthy("Dev3"))
			e.waitCapacity(t, resGPU, 1, 1)
			assert.Equal(t, []string{"Dev3"}, keys(e.mgr.GetAllocatableDevices()[resGPU]))

			// The newest registration is the primary.
			pd := pod("u1", ctr("c", resGPU, 1))
			e.pods.set(pd)
			require.NoError(t, e.mgr.Allocate(context.Background(), pd, &pd.Spec.Containers[0]))
			assert.Len(t, c.allocateCalls(), 1)
			assert.Empty(t, a.allocateCalls())
			assert.Empty(t, b.allocateCalls())

			// Losing one instance of several keeps the resource allocatable,
			// and a surviving instance becomes the primary.
			c.stop()
			a.update(healthy("Dev1"), healthy("Dev2"), healthy("Dev5"))
			e.waitAllocatable(t, resGPU, "Dev1", "Dev2", "Dev5")
			p2 := pod("u2", ctr("c", resGPU, 1))
			require.Eventually(t, func() bool { return e.allocate(p2, "c") == nil }, waitFor, tick,
				"no surviving instance was promoted to primary")
			assert.Len(t, c.allocateCalls(), 1)
			assert.Len(t, append(a.allocateCalls(), b.allocateCalls()...), 1)
			e.clock.Step(6 * time.Minute)
			cp, al, listed := capacityOf(e.mgr, resGPU)
			assert.True(t, listed)
			assert.Equal(t, int64(3), cp)
			assert.Equal(t, int64(3), al)
		})
	}
}

// No re-dial after the stream ends, as in the kubelet: the plugin
// re-registers, and that is accepted at any time.
func TestStreamEndNoRedialReRegisterAccepted(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	p := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	p.endStreams()
	e.waitCapacity(t, resGPU, 2, 0)
	assert.Equal(t, 1, p.streamCount())

	require.NoError(t, registerPlugin(t, e.dir, p))
	e.waitCapacity(t, resGPU, 2, 2)
	assert.Equal(t, 2, p.streamCount(), "exactly one new stream, from the re-registration")
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// The options are fetched inside Register; a failure is returned to the
// plugin and nothing is registered.
func TestRegisterFailsWhenOptionsCallFails(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	p := newFakePlugin(t, e.dir, "p.sock", resGPU, nil, healthy("d0"))
	p.optsErr = errors.New("options broken")
	p.start(t)
	err := registerPlugin(t, e.dir, p)
	require.Error(t, err)
	assert.Contains(t, status.Convert(err).Message(), "failed to get device plugin options")
	_, _, listed := capacityOf(e.mgr, resGPU)
	assert.False(t, listed)
	assert.Equal(t, 0, p.streamCount())
}

// Several resources may share one plugin socket; registering the second
// must not replace the first one's connection (a connection is replaced
// only by the same resource on the same socket).
func TestResourcesShareOneSocket(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	p := newFakePlugin(t, e.dir, "shared.sock", resGPU, nil, healthy("x0"), healthy("x1"))
	p.start(t)
	require.NoError(t, register(t, e.dir, &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: p.endpointName(), ResourceName: resGPU}))
	e.waitCapacity(t, resGPU, 2, 2)
	require.NoError(t, register(t, e.dir, &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: p.endpointName(), ResourceName: resNIC}))
	e.waitCapacity(t, resNIC, 2, 2)
	require.Eventually(t, func() bool { return p.openStreams() == 2 }, waitFor, tick, "one resource's stream was closed")
	e.clock.Step(time.Hour)
	e.waitCapacity(t, resGPU, 2, 2)
	e.waitCapacity(t, resNIC, 2, 2)
	p.update(healthy("x0"))
	e.waitCapacity(t, resGPU, 1, 1)
	e.waitCapacity(t, resNIC, 1, 1)
}

// The dial-back is bounded by DialTimeout and its failure carries the
// kubelet's text.
func TestRegisterDialTimeout(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.DialTimeout = 300 * time.Millisecond })
	e.start(t)
	// A socket that accepts connections but never speaks gRPC.
	lis, err := net.Listen("unix", filepath.Join(e.dir, "mute.sock"))
	require.NoError(t, err)
	var conns []net.Conn
	var mu sync.Mutex
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		_ = lis.Close()
		<-acceptDone
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
	}()
	conn, err := grpc.NewClient("unix://"+filepath.Join(e.dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "mute.sock", ResourceName: resGPU})
	require.Error(t, err)
	assert.NotEqual(t, codes.DeadlineExceeded, status.Code(ctx.Err()), "DialTimeout not honoured: the client gave up first")
	assert.Contains(t, status.Convert(err).Message(), "failed to dial device plugin")
}

// An old instance's late disconnect does not stop the newer instance of the
// same resource (the kubelet's behaviour since 1.37, upstream #127803).
func TestOldInstanceDisconnectKeepsNewInstance(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	old := e.plugin(t, "old.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	cur := e.plugin(t, "new.sock", resGPU, nil, healthy("d0"), healthy("d1"), healthy("d2"))
	old.stop()
	require.Eventually(t, func() bool { return old.openStreams() == 0 }, waitFor, tick)
	// The new instance keeps serving: its updates count, and it stays past
	// any grace period.
	cur.update(healthy("d0"), healthy("d1"), healthy("d2"), healthy("d3"))
	e.waitCapacity(t, resGPU, 4, 4)
	e.clock.Step(time.Hour)
	_, _, removed := e.mgr.GetCapacity()
	assert.Empty(t, removed)
	e.waitCapacity(t, resGPU, 4, 4)
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 2)), "c"))
	assert.Len(t, cur.allocateCalls(), 1)
	assert.Empty(t, old.allocateCalls())
}
