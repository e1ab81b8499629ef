package blackbox_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/podstate"
)

// SPEC 3.8: options are fetched inside Register; a failure is returned.
func TestRegisterOptionsRPCFailure(t *testing.T) {
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

// SPEC 7.4.5: several resources may share one plugin socket; registering
// the second must not replace the first one's connection (DESIGN diff. 6 is
// per resource and socket).
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

// DESIGN difference 3: every ID list sent to a plugin is sorted.
func TestPluginRequestsSortedIDs(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	var devs []*pluginapi.Device
	for _, id := range []string{"h", "c", "a", "g", "e", "b", "f", "d", "j", "i"} {
		devs = append(devs, healthy(id))
	}
	pl := e.plugin(t, "p.sock", resGPU,
		&pluginapi.DevicePluginOptions{PreStartRequired: true, GetPreferredAllocationAvailable: true}, devs...)
	p := pod("u1", ctr("app", resGPU, 7))
	p.Spec.InitContainers = []v1.Container{ctr("init", resGPU, 5)}
	require.NoError(t, e.allocate(p, "init"))
	require.NoError(t, e.allocate(p, "app"))
	_, err := e.runOptions(p, "app")
	require.NoError(t, err)
	for _, c := range pl.allocateCalls() {
		got := c.ContainerRequests[0].DevicesIds
		assert.True(t, slices.IsSorted(got), "Allocate IDs %v", got)
	}
	for _, c := range pl.preferredCalls() {
		r := c.ContainerRequests[0]
		assert.True(t, slices.IsSorted(r.AvailableDeviceIDs), "available %v", r.AvailableDeviceIDs)
		assert.True(t, slices.IsSorted(r.MustIncludeDeviceIDs), "mustInclude %v", r.MustIncludeDeviceIDs)
	}
	calls := pl.preStartCalls()
	require.Len(t, calls, 1)
	assert.True(t, slices.IsSorted(calls[0].DevicesIds), "PreStart IDs %v", calls[0].DevicesIds)
	assert.Len(t, calls[0].DevicesIds, 7)
}

// SPEC 3.1 step 1: the reuse pool only holds the pod being admitted.
func TestReusePoolResetByAnotherPod(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("a"), healthy("b"), healthy("c"))
	pa := pod("A", ctr("app", resGPU, 1))
	pa.Spec.InitContainers = []v1.Container{ctr("init", resGPU, 1)}
	require.NoError(t, e.allocate(pa, "init"))
	require.NoError(t, e.allocate(pod("B", ctr("app", resGPU, 1)), "app"))
	require.NoError(t, e.allocate(pa, "app"))
	initIDs := sets.New(ids(e.mgr, "A", "init", resGPU)...)
	appIDs := sets.New(ids(e.mgr, "A", "app", resGPU)...)
	assert.Empty(t, initIDs.Intersection(appIDs), "A's app reused its init device after another pod was admitted")
}

// SPEC 3.2 step 1: DRA-backed extended resources are skipped.
func TestAllocateSkipsDRAExtendedResources(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.RequirePlugin = []string{"example.com/*"} })
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"))
	p := pod("u1", ctr("c", "example.com/dra", 1, resGPU, 1))
	p.Status.ExtendedResourceClaimStatus = &v1.PodExtendedResourceClaimStatus{
		ResourceClaimName: "claim",
		RequestMappings: []v1.ContainerExtendedResourceRequest{
			{ContainerName: "c", ResourceName: "example.com/dra", RequestName: "r0"},
			{ContainerName: "c", ResourceName: resGPU, RequestName: "r1"},
		},
	}
	require.NoError(t, e.allocate(p, "c"))
	assert.Empty(t, pl.allocateCalls(), "a DRA-backed resource went to the device plugin")
	assert.Empty(t, e.mgr.GetDevices("u1", "c"))

	// The mapping is per container.
	q := pod("u2", ctr("c", "example.com/dra", 1))
	q.Status.ExtendedResourceClaimStatus = &v1.PodExtendedResourceClaimStatus{
		RequestMappings: []v1.ContainerExtendedResourceRequest{{ContainerName: "other", ResourceName: "example.com/dra"}},
	}
	err := e.allocate(q, "c")
	assert.ErrorIs(t, err, devicemanager.ErrUnregisteredResource)
}

// SPEC 5.4 step 3: hints account for the reuse pool.
func TestTopologyHintsWithReusableDevices(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.NUMANodes = []int{0, 1, 2, 3} })
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
		healthy("a", 0), healthy("b", 1))
	pl.setPreferred(func(context.Context, *pluginapi.ContainerPreferredAllocationRequest) ([]string, error) {
		return []string{"a"}, nil
	})
	p := pod("u1", ctr("app1", resGPU, 1), ctr("app2", resGPU, 2))
	p.Spec.InitContainers = []v1.Container{ctr("init", resGPU, 1)}
	require.NoError(t, e.allocate(p, "init"))
	require.Equal(t, []string{"a"}, ids(e.mgr, "u1", "init", resGPU))
	assert.Equal(t, []string{"0/P", "0,1/-"}, hintStrings(e.mgr.GetTopologyHints(p, findContainer(p, "app1"))[resGPU]))
	assert.Equal(t, []string{"0,1/P"}, hintStrings(e.mgr.GetTopologyHints(p, findContainer(p, "app2"))[resGPU]))
}

// SPEC 3.9: only containers found running skip the checks while sources are
// not ready.
func TestRestartNotRunningContainerChecked(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	p := pod("u1", ctr("c", resGPU, 1), ctr("d", resGPU, 1))
	require.NoError(t, e.allocate(p, "c"))
	require.NoError(t, e.allocate(p, "d"))
	pl.stop()
	e.waitCapacity(t, resGPU, 2, 0)
	require.NoError(t, e.mgr.Stop())

	e.ready.v.Store(false)
	// "c" is known but not running; "d" runs under a second ID too.
	cmap := podstate.ContainerMap{"id-c": {PodUID: "u1", ContainerName: "c"}, "id-d1": {PodUID: "u1", ContainerName: "d"}, "id-d2": {PodUID: "u1", ContainerName: "d"}}
	e.startWith(t, cmap, sets.New("id-d2"))
	err := e.allocate(p, "c")
	assert.ErrorIs(t, err, devicemanager.ErrNoHealthyDevices)
	assert.NoError(t, e.allocate(p, "d"))
}

// The checkpoint keeps a registered resource with no healthy device as an
// empty list (SPEC 6.2), including one restored from a checkpoint.
func TestCheckpointRegisteredWithoutHealthy(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"))
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 1)), "c"))
	pl.update(unhealthy("d0"))
	e.waitCapacity(t, resGPU, 1, 0)
	require.Eventually(t, func() bool {
		_, reg, ok := tryReadCheckpoint(e.dir)
		l, has := reg[resGPU]
		return ok && has && l != nil && len(l) == 0
	}, waitFor, tick, "all-unhealthy resource must be written as []")
	pl.stop()
	e.waitCapacity(t, resGPU, 1, 0)
	require.NoError(t, e.mgr.Stop())

	e.start(t)
	e.plugin(t, "n.sock", resNIC, nil, healthy("n0"))
	require.Eventually(t, func() bool {
		_, reg, ok := tryReadCheckpoint(e.dir)
		return ok && len(reg[resNIC]) == 1
	}, waitFor, tick)
	_, reg := readCheckpoint(t, e.dir)
	l, ok := reg[resGPU]
	assert.True(t, ok, "restored resource dropped from RegisteredDevices")
	assert.NotNil(t, l)
	assert.Empty(t, l)
}

// Stop while a plugin call hangs: Stop returns, the call fails, nothing leaks.
func TestStopDuringHungAllocate(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	e := newEnv(t, nil)
	m, err := devicemanager.NewManagerImpl(e.opts)
	require.NoError(t, err)
	require.NoError(t, m.Start(e.pods.get, e.ready, nil, nil))
	e.mgr = m
	pl := newFakePlugin(t, e.dir, "p.sock", resGPU, nil, healthy("d0"))
	pl.setAllocate(func(ctx context.Context, _ *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	pl.start(t)
	require.NoError(t, registerPlugin(t, e.dir, pl))
	e.waitCapacity(t, resGPU, 1, 1)

	res := make(chan error, 1)
	go func() { res <- e.allocate(pod("u1", ctr("c", resGPU, 1)), "c") }()
	require.Eventually(t, func() bool { return len(pl.allocateCalls()) == 1 }, waitFor, tick)
	stopped := make(chan struct{})
	go func() {
		_ = m.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(waitFor):
		t.Fatal("Stop blocked on a hung plugin call")
	}
	select {
	case err := <-res:
		assert.Error(t, err)
	case <-time.After(waitFor):
		t.Fatal("Allocate still hung after Stop")
	}
	require.Eventually(t, func() bool { return pl.openStreams() == 0 }, waitFor, tick, "Stop did not disconnect the plugin")
	pl.stop()
	goleak.VerifyNone(t, ignore)
}

// Every method is safe for concurrent use (SPEC 10.2 TestGetTopologyHintsWithUpdates).
func TestConcurrentUse(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.NUMANodes = []int{0, 1} })
	e.start(t)
	var devs []*pluginapi.Device
	for i := range 200 {
		devs = append(devs, healthy(fmt.Sprintf("d%03d", i), int64(i%2)))
	}
	pl := e.plugin(t, "p.sock", resGPU, nil, devs...)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 20 {
			d := cloneDevices(devs)
			d[i].Health = pluginapi.Unhealthy
			pl.update(d...)
		}
	}()
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				p := pod(fmt.Sprintf("w%d-%d", w, i), ctr("c", resGPU, 1))
				_ = e.allocate(p, "c")
				_ = e.mgr.GetTopologyHints(p, &p.Spec.Containers[0])
				_ = e.mgr.GetPodTopologyHints(p)
				_, _, _ = e.mgr.GetCapacity()
				_ = e.mgr.GetAllocatableDevices()
				_ = e.mgr.GetDevices(string(p.UID), "c")
				_, _ = e.runOptions(p, "c")
				st := &v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: "c"}}}
				e.mgr.UpdateAllocatedResourcesStatus(p, st)
				_ = e.mgr.UpdatePluginResources(v1.ResourceList{}, p)
				if i%5 == 0 {
					e.pods.set()
					e.mgr.UpdateAllocatedDevices()
				}
				if i > 30 {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	e.waitCapacity(t, resGPU, 200, 199)
	for {
		select {
		case <-e.mgr.Updates():
			continue
		default:
		}
		break
	}
}

// SPEC 7.4 step 2: the dial-back is bounded by DialTimeout and its failure
// carries the kubelet's text.
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

// SPEC 3.3 notes: extra preferred IDs: an arbitrary subset is taken.
func TestPreferredMoreThanNeeded(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, fourGPUs()...)
	pl.setPreferred(func(context.Context, *pluginapi.ContainerPreferredAllocationRequest) ([]string, error) {
		return []string{"d3", "d1", "d2"}, nil
	})
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 2)), "c"))
	got := ids(e.mgr, "u1", "c", resGPU)
	assert.Len(t, got, 2)
	assert.Subset(t, []string{"d1", "d2", "d3"}, got)
}

// SPEC 3.2: only limits count; requests are ignored.
func TestAllocateIgnoresRequestsWithoutLimits(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"))
	p := pod("u1", ctr("c"))
	p.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceName(resGPU): resource.MustParse("1")}
	require.NoError(t, e.allocate(p, "c"))
	assert.Empty(t, pl.allocateCalls())
}

// SPEC 4.4: the podresources view: a device on two NUMA nodes reports both;
// a device with an empty node list has no topology; values carry only the
// topology.
func TestGetDevicesView(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.NUMANodes = []int{0, 1} })
	e.start(t)
	empty := healthy("e")
	empty.Topology = &pluginapi.TopologyInfo{}
	e.plugin(t, "p.sock", resGPU, nil, healthy("m", 0, 1), empty, healthy("s", 1))
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 3)), "c"))
	got := e.mgr.GetDevices("u1", "c")[resGPU]
	require.Len(t, got, 3)
	nodes := func(id string) []int64 {
		var out []int64
		for _, n := range got[id].GetTopology().GetNodes() {
			out = append(out, n.ID)
		}
		slices.Sort(out)
		return out
	}
	assert.Equal(t, []int64{0, 1}, nodes("m"))
	assert.Equal(t, []int64{1}, nodes("s"))
	assert.Nil(t, got["e"].GetTopology())
	for id, d := range got {
		assert.Empty(t, d.GetID(), "%s: only Topology is set (SPEC 4.4)", id)
		assert.Empty(t, d.GetHealth(), "%s: only Topology is set (SPEC 4.4)", id)
	}
	entries, _ := readCheckpoint(t, e.dir)
	require.Len(t, entries, 1)
	assert.Equal(t, checkpointIDs{-1: {"e"}, 0: {"m"}, 1: {"m", "s"}}, checkpointIDs(entries[0].DeviceIDs))
	assert.Nil(t, e.mgr.GetDevices("u1", "nope"))
	assert.Nil(t, e.mgr.GetDevices("nope", "c"))
}

// SPEC 4.3: first wins per env key / container path; CDI names deduplicated
// within and across responses.
func TestRunOptionsConflicts(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	gpu := e.plugin(t, "g.sock", resGPU, nil, healthy("g0"))
	nic := e.plugin(t, "n.sock", resNIC, nil, healthy("n0"))
	gpu.setAllocate(fixedResponse(&pluginapi.ContainerAllocateResponse{
		Envs:       map[string]string{"X": "1"},
		Mounts:     []*pluginapi.Mount{{ContainerPath: "/c", HostPath: "/g"}},
		Devices:    []*pluginapi.DeviceSpec{{ContainerPath: "/dev/x", HostPath: "/dev/g"}},
		CdiDevices: []*pluginapi.CDIDevice{{Name: "v/c=1"}, {Name: "v/c=1"}},
	}))
	nic.setAllocate(fixedResponse(&pluginapi.ContainerAllocateResponse{
		Envs:    map[string]string{"X": "2"},
		Mounts:  []*pluginapi.Mount{{ContainerPath: "/c", HostPath: "/n"}},
		Devices: []*pluginapi.DeviceSpec{{ContainerPath: "/dev/x", HostPath: "/dev/n"}},
	}))
	p := pod("u1", ctr("c", resGPU, 1, resNIC, 1))
	require.NoError(t, e.allocate(p, "c"))
	o, err := e.runOptions(p, "c")
	require.NoError(t, err)
	require.NotNil(t, o)
	assert.Len(t, o.Envs, 1)
	assert.Len(t, o.Mounts, 1)
	assert.Len(t, o.Devices, 1)
	assert.Equal(t, []devicemanager.CDIDevice{{Name: "v/c=1"}}, o.CDIDevices)
	// Consistent winner: all from the same resource or not, but one each.
	assert.Contains(t, []string{"1", "2"}, o.Envs[0].Value)
}

// DESIGN difference 2: a recorded device missing from the device list counts
// as "no topology" (no panic in hints or allocation).
func TestMissingDevicesCountAsNoTopology(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.NUMANodes = []int{0, 1} })
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("a", 0), healthy("b", 1))
	p := pod("u1", ctr("app", resGPU, 1))
	p.Spec.InitContainers = []v1.Container{ctr("init", resGPU, 2)}
	require.NoError(t, e.allocate(p, "init"))
	pl.update(healthy("c", 0), healthy("d", 1))
	e.waitAllocatable(t, resGPU, "c", "d")
	h := e.mgr.GetTopologyHints(p, findContainer(p, "init"))
	require.NotNil(t, h[resGPU])
	assert.Empty(t, h[resGPU])
	// app: reusable a,b (missing → no topology, not counted), available c,d.
	h = e.mgr.GetTopologyHints(p, findContainer(p, "app"))
	assert.Equal(t, []string{"0/P", "1/P", "0,1/-"}, hintStrings(h[resGPU]))
	_ = e.mgr.GetPodTopologyHints(p)
	st := &v1.PodStatus{InitContainerStatuses: []v1.ContainerStatus{{Name: "init"}}, ContainerStatuses: []v1.ContainerStatus{{Name: "app"}}}
	e.mgr.UpdateAllocatedResourcesStatus(p, st)
}

type checkpointIDs map[int64][]string

// SPEC 3.8 (1.37, upstream #127803): an old instance's late disconnect does
// not stop the newer instance of the same resource.
func TestOldInstanceLateDisconnect(t *testing.T) {
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

// SPEC 3.2 step 3: Allocate garbage-collects pods that are no longer active.
func TestAllocateCollectsInactivePods(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	require.NoError(t, e.allocate(pod("old", ctr("c", resGPU, 2)), "c"))
	e.pods.set()
	require.NoError(t, e.allocate(pod("new", ctr("c", resGPU, 2)), "c"))
	assert.Empty(t, e.mgr.GetDevices("old", "c"))
	assert.Len(t, ids(e.mgr, "new", "c", resGPU), 2)
}

// SPEC 5.4 step 1: NUMA ids the machine does not know are dropped.
func TestHintsDropUnknownNUMANodes(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.NUMANodes = []int{0, 1} })
	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("a", 0), healthy("b", 5))
	p := pod("u1", ctr("c", resGPU, 1))
	assert.Equal(t, []string{"0/P"}, hintStrings(e.mgr.GetTopologyHints(p, &p.Spec.Containers[0])[resGPU]))
	p2 := pod("u2", ctr("c", resGPU, 2))
	h := e.mgr.GetTopologyHints(p2, &p2.Spec.Containers[0])
	require.NotNil(t, h[resGPU])
	assert.Empty(t, h[resGPU])
}

// SPEC 5.3: pod scope, a pod that already holds devices gets the hints of
// exactly those; a mismatch gives [].
func TestPodHintsAlreadyAllocated(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) {
		o.NUMANodes = []int{0, 1}
		o.AffinityStore = fixedAffinity{nodes: []int{1}}
	})
	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("a", 0), healthy("b", 1), healthy("c", 1))
	p := pod("u1", ctr("x", resGPU, 1), ctr("y", resGPU, 1))
	require.NoError(t, e.allocate(p, "x"))
	require.NoError(t, e.allocate(p, "y"))
	require.Equal(t, []string{"b", "c"}, sortedCopy(append(ids(e.mgr, "u1", "x", resGPU), ids(e.mgr, "u1", "y", resGPU)...)), "aligned picks")
	assert.Equal(t, []string{"1/P", "0,1/-"}, hintStrings(e.mgr.GetPodTopologyHints(p)[resGPU]))
	bigger := pod("u1", ctr("x", resGPU, 1), ctr("y", resGPU, 2))
	h := e.mgr.GetPodTopologyHints(bigger)
	require.NotNil(t, h[resGPU])
	assert.Empty(t, h[resGPU])
}

// SPEC 3.7 (a): a change of the Health string notifies, even between two
// unhealthy values.
func TestUpdatesOnAnyHealthStringChange(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 2)), "c"))
	pl.update(unhealthy("d0"), healthy("d1"))
	e.waitCapacity(t, resGPU, 2, 1)
	assert.Equal(t, []string{"u1"}, nextUpdate(t, e.mgr))
	pl.update(dev("d0", "Unknown"), healthy("d1"), healthy("d2"))
	e.waitCapacity(t, resGPU, 3, 2)
	assert.Equal(t, []string{"u1"}, nextUpdate(t, e.mgr))
}

// Options.MaxRecvMsgSize bounds one ListAndWatch message.
func TestMaxRecvMsgSizeOption(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.MaxRecvMsgSize = 2048 })
	e.start(t)
	small := e.plugin(t, "s.sock", resNIC, nil, healthy("n0"))
	assert.Equal(t, 1, small.openStreams())
	var devs []*pluginapi.Device
	for i := range 100 {
		devs = append(devs, healthy(fmt.Sprintf("%060d", i)))
	}
	big := newFakePlugin(t, e.dir, "b.sock", resGPU, nil, devs...)
	big.start(t)
	require.NoError(t, registerPlugin(t, e.dir, big))
	require.Eventually(t, func() bool { return big.streamCount() == 1 && big.openStreams() == 0 }, waitFor, tick,
		"an oversized message did not end the stream")
	_, a, _ := capacityOf(e.mgr, resGPU)
	assert.Zero(t, a)
}

// DESIGN Options.NUMANodes: empty means no topology: no preference.
func TestHintsWithoutMachineTopology(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("a", 0), healthy("b", 1))
	p := pod("u1", ctr("c", resGPU, 1))
	h := e.mgr.GetTopologyHints(p, &p.Spec.Containers[0])
	require.Contains(t, h, resGPU)
	assert.Nil(t, h[resGPU])
	h = e.mgr.GetPodTopologyHints(p)
	require.Contains(t, h, resGPU)
	assert.Nil(t, h[resGPU])
}

// SPEC 3.9: restored allocations keep their devices in use once the plugin
// is back.
func TestRestoredAllocationsStayAllocated(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"), healthy("d2"))
	p := pod("u1", ctr("c", resGPU, 2))
	require.NoError(t, e.allocate(p, "c"))
	held := ids(e.mgr, "u1", "c", resGPU)
	pl.stop()
	require.NoError(t, e.mgr.Stop())

	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"), healthy("d2"))
	err := e.allocate(pod("u2", ctr("c", resGPU, 2)), "c")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrInsufficientDevices)
	assert.Contains(t, err.Error(), "Requested: 2, Available: 1")
	require.NoError(t, e.allocate(pod("u3", ctr("c", resGPU, 1)), "c"))
	assert.Empty(t, sets.New(held...).Intersection(sets.New(ids(e.mgr, "u3", "c", resGPU)...)))
}

// Getters hand out copies: a caller mutating them changes nothing.
func TestGettersReturnCopies(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 1)), "c"))
	all := e.mgr.GetAllocatableDevices()
	delete(all[resGPU], "d0")
	delete(all, resGPU)
	assert.Len(t, e.mgr.GetAllocatableDevices()[resGPU], 2)
	got := e.mgr.GetDevices("u1", "c")
	delete(got, resGPU)
	assert.Len(t, e.mgr.GetDevices("u1", "c")[resGPU], 1)
}

// DESIGN difference 5: a hung GetPreferredAllocation stalls only its resource.
func TestHungPreferredStallsOnlyItsResource(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	gpu := e.plugin(t, "g.sock", resGPU, &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, healthy("g0"), healthy("g1"))
	e.plugin(t, "n.sock", resNIC, nil, healthy("n0"))
	release := make(chan struct{})
	gpu.setPreferred(func(ctx context.Context, _ *pluginapi.ContainerPreferredAllocationRequest) ([]string, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	})
	var once sync.Once
	defer once.Do(func() { close(release) })
	p1 := pod("u1", ctr("c", resGPU, 1))
	e.pods.add(p1)
	hung := make(chan error, 1)
	go func() { hung <- e.mgr.Allocate(context.Background(), p1, &p1.Spec.Containers[0]) }()
	require.Eventually(t, func() bool { return len(gpu.preferredCalls()) == 1 }, waitFor, tick)
	other := make(chan error, 1)
	go func() { other <- e.allocate(pod("u2", ctr("c", resNIC, 1)), "c") }()
	select {
	case err := <-other:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("a hung GetPreferredAllocation blocked another resource")
	}
	once.Do(func() { close(release) })
	require.NoError(t, <-hung)
}

// SPEC 3.3 step 7b: "Requested" in the message is what remains after reuse.
func TestInsufficientMessageCountsAfterReuse(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("a"), healthy("b"), healthy("c"))
	p := pod("u1", ctr("app", resGPU, 4))
	p.Spec.InitContainers = []v1.Container{ctr("init", resGPU, 2)}
	require.NoError(t, e.allocate(p, "init"))
	err := e.allocate(p, "app")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrInsufficientDevices)
	assert.Contains(t, err.Error(), "requested number of devices unavailable for vendor.com/gpu. Requested: 2, Available: 1")
	assert.Empty(t, e.mgr.GetDevices("u1", "app"))
}

// SPEC 3.2 step 8: only the first container response is used.
func TestAllocateExtraContainerResponsesIgnored(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"))
	pl.setAllocate(func(context.Context, *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		return &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{
			{Envs: map[string]string{"FIRST": "1"}}, {Envs: map[string]string{"SECOND": "2"}},
		}}, nil
	})
	p := pod("u1", ctr("c", resGPU, 1))
	require.NoError(t, e.allocate(p, "c"))
	o, err := e.runOptions(p, "c")
	require.NoError(t, err)
	require.NotNil(t, o)
	assert.Equal(t, []devicemanager.EnvVar{{Name: "FIRST", Value: "1"}}, o.Envs)
}

// SPEC 2.4 GetCapacity/GetAllocatableDevices: a resource whose plugin lists
// no device stays listed with zero.
func TestEmptyDeviceListKeepsResource(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"))
	pl.update()
	e.waitCapacity(t, resGPU, 0, 0)
	all := e.mgr.GetAllocatableDevices()
	inner, ok := all[resGPU]
	assert.True(t, ok)
	assert.Empty(t, inner)
	err := e.allocate(pod("u1", ctr("c", resGPU, 1)), "c")
	assert.ErrorIs(t, err, devicemanager.ErrNoHealthyDevices)
}

// SPEC 3.3 steps 1-2 at node restart, sources not ready: a changed request
// is still refused; a running container without any record passes without
// an RPC.
func TestRestartShortCutOrder(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 1)), "c"))
	pl.stop()
	require.NoError(t, e.mgr.Stop())

	e.ready.v.Store(false)
	cmap := podstate.ContainerMap{"id1": {PodUID: "u1", ContainerName: "c"}, "id2": {PodUID: "u2", ContainerName: "c"}}
	e.startWith(t, cmap, sets.New("id1", "id2"))
	pl2 := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	err := e.allocate(pod("u1", ctr("c", resGPU, 2)), "c")
	assert.ErrorIs(t, err, devicemanager.ErrRequestChanged)
	assert.NoError(t, e.allocate(pod("u2", ctr("c", resGPU, 1)), "c"))
	assert.Empty(t, pl2.allocateCalls())
	assert.Empty(t, e.mgr.GetDevices("u2", "c"))
}

// DESIGN checkpoint: MarshalCheckpoint encodes exactly the data given, in
// order (nil stays null).
func TestCheckpointEncodesDataAsGiven(t *testing.T) {
	b, err := checkpoint.New(nil, nil).MarshalCheckpoint()
	require.NoError(t, err)
	assert.Contains(t, string(b), `{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":`)
	e1 := checkpoint.PodDevicesEntry{PodUID: "b", ContainerName: "c", ResourceName: "r", DeviceIDs: checkpoint.DevicesPerNUMA{1: {"y", "x"}}}
	e2 := checkpoint.PodDevicesEntry{PodUID: "a", ContainerName: "c", ResourceName: "r", DeviceIDs: checkpoint.DevicesPerNUMA{10: {"z"}, 2: {"w"}, -1: {"v"}}}
	b, err = checkpoint.New([]checkpoint.PodDevicesEntry{e1, e2}, map[string][]string{"r": {"y", "x"}}).MarshalCheckpoint()
	require.NoError(t, err)
	assert.Contains(t, string(b), `{"PodUID":"b","ContainerName":"c","ResourceName":"r","DeviceIDs":{"1":["y","x"]},"AllocResp":null},{"PodUID":"a","ContainerName":"c","ResourceName":"r","DeviceIDs":{"-1":["v"],"10":["z"],"2":["w"]},"AllocResp":null}`)
	assert.Contains(t, string(b), `"RegisteredDevices":{"r":["y","x"]}`)
	cp := checkpoint.New(nil, nil)
	require.NoError(t, cp.UnmarshalCheckpoint(b))
	require.NoError(t, cp.VerifyChecksum())
	entries, _ := cp.GetData()
	assert.Equal(t, []checkpoint.PodDevicesEntry{e1, e2}, entries)
}

// DESIGN Start: nil activePods and sourcesReady mean no pods, always ready.
func TestStartNilArguments(t *testing.T) {
	dir := tempDir(t)
	m, err := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir})
	require.NoError(t, err)
	require.NoError(t, m.Start(nil, nil, nil, nil))
	defer func() { _ = m.Stop() }()
	pl := newFakePlugin(t, dir, "p.sock", resGPU, nil, healthy("d0"))
	pl.start(t)
	require.NoError(t, registerPlugin(t, dir, pl))
	require.Eventually(t, func() bool { _, a, _ := capacityOf(m, resGPU); return a == 1 }, waitFor, tick)
	p := pod("u1", ctr("c", resGPU, 1))
	require.NoError(t, m.Allocate(context.Background(), p, &p.Spec.Containers[0]))
	assert.Len(t, m.GetDevices("u1", "c")[resGPU], 1)
	m.UpdateAllocatedDevices() // no active pods, always ready: collected
	assert.Empty(t, m.GetDevices("u1", "c"))
}

// DESIGN difference 1 (upstream PR #137534): a pending reservation survives a
// concurrent garbage collection that rebuilds the in-use set.
func TestPendingReservationSurvivesGC(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	gpu := e.plugin(t, "g.sock", resGPU, nil, healthy("g0"), healthy("g1"), healthy("g2"))
	q := pod("q", ctr("c", resGPU, 1))
	require.NoError(t, e.allocate(q, "c"))

	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	gpu.setAllocate(func(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{{}}}, nil
	})
	p := pod("p", ctr("c", resGPU, 1))
	e.pods.set(p) // q is no longer active
	hung := make(chan error, 1)
	go func() { hung <- e.mgr.Allocate(context.Background(), p, &p.Spec.Containers[0]) }()
	require.Eventually(t, func() bool { return len(gpu.allocateCalls()) == 2 }, waitFor, tick)
	pending := gpu.allocateCalls()[1].ContainerRequests[0].DevicesIds
	require.Len(t, pending, 1)

	e.mgr.UpdateAllocatedDevices() // removes q and rebuilds what is in use
	require.Empty(t, e.mgr.GetDevices("q", "c"))
	gpu.setAllocate(nil)
	r1 := pod("r1", ctr("c", resGPU, 1))
	r2 := pod("r2", ctr("c", resGPU, 1))
	e.pods.add(r1, r2)
	require.NoError(t, e.mgr.Allocate(context.Background(), r1, &r1.Spec.Containers[0]))
	require.NoError(t, e.mgr.Allocate(context.Background(), r2, &r2.Spec.Containers[0]))
	r3 := pod("r3", ctr("c", resGPU, 1))
	e.pods.add(r3)
	assert.ErrorIs(t, e.mgr.Allocate(context.Background(), r3, &r3.Spec.Containers[0]), devicemanager.ErrInsufficientDevices,
		"the pending device was handed out again")
	once.Do(func() { close(release) })
	require.NoError(t, <-hung)
	got := append(append(ids(e.mgr, "p", "c", resGPU), ids(e.mgr, "r1", "c", resGPU)...), ids(e.mgr, "r2", "c", resGPU)...)
	assert.Equal(t, []string{"g0", "g1", "g2"}, sortedCopy(got))
	assert.Equal(t, pending, ids(e.mgr, "p", "c", resGPU))
}
