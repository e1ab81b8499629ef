package blackbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
)

func fourGPUs() []*pluginapi.Device {
	return []*pluginapi.Device{healthy("d3"), healthy("d1"), healthy("d0"), healthy("d2")}
}

// The ordinary admission: the plugin's Allocate gets the picked IDs, sorted
// (the kubelet sends them in map order), the checkpoint holds the record
// before Allocate returns, a second admission of the same container makes no
// call, and other pods get other devices until none is left.
func TestAllocateBasic(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, fourGPUs()...)

	p1 := pod("u1", ctr("c", resGPU, 2, "cpu", 1))
	require.NoError(t, e.allocate(p1, "c"))
	calls := pl.allocateCalls()
	require.Len(t, calls, 1)
	require.Len(t, calls[0].ContainerRequests, 1)
	got := calls[0].ContainerRequests[0].DevicesIds
	assert.Len(t, got, 2)
	assert.True(t, slices.IsSorted(got), "device IDs in Allocate request not sorted: %v", got)
	assert.Equal(t, sortedCopy(got), ids(e.mgr, "u1", "c", resGPU))

	entries, _ := readCheckpoint(t, e.dir)
	require.Len(t, entries, 1, "checkpoint not written before Allocate returned")
	assert.Equal(t, "u1", entries[0].PodUID)
	assert.Equal(t, "c", entries[0].ContainerName)
	assert.Equal(t, resGPU, entries[0].ResourceName)

	// Capacity counts devices, not free ones.
	e.waitCapacity(t, resGPU, 4, 4)

	// Same container again: nothing to do, no RPC.
	require.NoError(t, e.allocate(p1, "c"))
	assert.Len(t, pl.allocateCalls(), 1)

	p2 := pod("u2", ctr("c", resGPU, 2))
	require.NoError(t, e.allocate(p2, "c"))
	assert.Empty(t, sets.New(ids(e.mgr, "u1", "c", resGPU)...).Intersection(sets.New(ids(e.mgr, "u2", "c", resGPU)...)))

	p3 := pod("u3", ctr("c", resGPU, 1))
	err := e.allocate(p3, "c")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrInsufficientDevices)
	assert.Contains(t, err.Error(), "requested number of devices unavailable for vendor.com/gpu. Requested: 1, Available: 0")
	assert.Empty(t, e.mgr.GetDevices("u3", "c"))
}

// An extended resource that no plugin registered and that holds no
// allocation is ignored at admission, as the kubelet does (admins advertise
// such resources by hand), unless Options.RequirePlugin names it.
func TestAllocateUnregisteredResource(t *testing.T) {
	for _, tc := range []struct {
		name    string
		require []string
		wantErr bool
	}{
		{"ignored", nil, false},
		{"required by name", []string{"example.com/foo"}, true},
		{"required by domain", []string{"example.com/*"}, true},
		{"other domain required", []string{"other.com/*", "example.com/bar"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(o *devicemanager.Options) { o.RequirePlugin = tc.require })
			e.start(t)
			e.plugin(t, "p.sock", resGPU, nil, healthy("d0"))
			p := pod("u1", ctr("c", "example.com/foo", 1, "cpu", 2))
			err := e.allocate(p, "c")
			if !tc.wantErr {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, devicemanager.ErrUnregisteredResource)
			assert.Contains(t, err.Error(), "cannot allocate unregistered device example.com/foo")
		})
	}
}

// A resource that still holds allocations stays a device-plugin resource
// after its plugin is gone and the grace period removed it: a new pod asking
// for it is refused, not started without the device.
func TestAllocateResourceGoneAfterGrace(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.StopGracePeriod = time.Minute })
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 1)), "c"))
	pl.stop()
	e.waitCapacity(t, resGPU, 2, 0)
	e.clock.Step(time.Minute + time.Second)
	_, _, removed := e.mgr.GetCapacity()
	require.Equal(t, []string{resGPU}, removed)

	err := e.allocate(pod("u2", ctr("c", resGPU, 1)), "c")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrUnregisteredResource)
	assert.Contains(t, err.Error(), "cannot allocate unregistered device vendor.com/gpu")
}

// A registered resource with no healthy device refuses admission, even for
// a request of zero devices (the kubelet checks health even when nothing is
// to be picked).
func TestAllocateNoHealthyDevices(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, unhealthy("d0"), unhealthy("d1"))
	for _, n := range []int{1, 0} {
		err := e.allocate(pod(fmt.Sprintf("u%d", n), ctr("c", resGPU, n)), "c")
		require.Error(t, err, "quantity %d", n)
		assert.ErrorIs(t, err, devicemanager.ErrNoHealthyDevices)
		assert.Contains(t, err.Error(), "no healthy devices present; cannot allocate unhealthy devices vendor.com/gpu")
	}
	// Zero quantity with healthy devices: no error, no RPC, no record.
	pl.update(healthy("d0"))
	e.waitCapacity(t, resGPU, 1, 1)
	p := pod("z", ctr("c", resGPU, 0))
	require.NoError(t, e.allocate(p, "c"))
	assert.Empty(t, pl.allocateCalls())
	assert.Empty(t, e.mgr.GetDevices("z", "c"))
}

// A container admitted again with a different count is refused; its record
// stays as it was.
func TestAllocateChangedRequest(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, fourGPUs()...)
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 1)), "c"))
	// Same pod UID and container, different request; the kubelet checks
	// this first, before any health check, so it is the error even when no
	// device is healthy.
	pl.update(unhealthy("d0"), unhealthy("d1"), unhealthy("d2"), unhealthy("d3"))
	e.waitCapacity(t, resGPU, 4, 0)
	err := e.allocate(pod("u1", ctr("c", resGPU, 2)), "c")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrRequestChanged)
	assert.Contains(t, err.Error(), `pod "u1" container "c" changed request for resource "vendor.com/gpu" from 1 to 2`)
	assert.Len(t, ids(e.mgr, "u1", "c", resGPU), 1, "a failed re-admission dropped the earlier record")
}

// A container whose recorded devices turned unhealthy is refused when it is
// admitted again, and passes with no new plugin call once they are back.
func TestAllocatePreviouslyAllocatedUnhealthy(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	p := pod("u1", ctr("c", resGPU, 1))
	require.NoError(t, e.allocate(p, "c"))
	mine := ids(e.mgr, "u1", "c", resGPU)
	require.Len(t, mine, 1)
	other := "d0"
	if mine[0] == "d0" {
		other = "d1"
	}
	pl.update(unhealthy(mine[0]), healthy(other))
	e.waitCapacity(t, resGPU, 2, 1)
	err := e.allocate(p, "c")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrAllocatedDeviceUnhealthy)
	assert.Contains(t, err.Error(), "previously allocated devices are no longer healthy; cannot allocate unhealthy devices vendor.com/gpu")

	// Healthy again: the container passes with no new RPC (needed = 0).
	pl.update(healthy(mine[0]), healthy(other))
	e.waitCapacity(t, resGPU, 2, 2)
	require.NoError(t, e.allocate(p, "c"))
	assert.Len(t, pl.allocateCalls(), 1)
}

// A failed plugin Allocate rolls back the devices picked for it: no record,
// nothing in the checkpoint, and the devices are free again.
func TestAllocatePluginErrorRollsBack(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, fourGPUs()...)
	pl.setAllocate(func(context.Context, *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		return nil, status.Error(codes.Internal, "boom from plugin")
	})
	err := e.allocate(pod("u1", ctr("c", resGPU, 3)), "c")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrPluginCall)
	assert.Contains(t, err.Error(), "boom from plugin")
	assert.Equal(t, codes.Internal, status.Code(err), "the gRPC error is wrapped")
	assert.Empty(t, e.mgr.GetDevices("u1", "c"))

	pl.setAllocate(nil)
	require.NoError(t, e.allocate(pod("u2", ctr("c", resGPU, 4)), "c"), "devices of the failed call were not freed")
	entries, _ := readCheckpoint(t, e.dir)
	for _, en := range entries {
		assert.NotEqual(t, "u1", en.PodUID)
	}
}

// A plugin answer with no container response is an error (the kubelet's
// text), and the admission leaves nothing behind.
func TestAllocateEmptyResponse(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	pl.setAllocate(func(context.Context, *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		return &pluginapi.AllocateResponse{}, nil
	})
	err := e.allocate(pod("u1", ctr("c", resGPU, 2)), "c")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no containers return in allocation response")
	assert.Empty(t, e.mgr.GetDevices("u1", "c"))
	pl.setAllocate(nil)
	require.NoError(t, e.allocate(pod("u2", ctr("c", resGPU, 2)), "c"))
}

// Admission of a container is all or nothing across its resources, whichever
// resource fails and in whichever order.
func TestAllocateAllOrNothing(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	gpu := e.plugin(t, "g.sock", resGPU, nil, healthy("g0"), healthy("g1"))
	nic := e.plugin(t, "n.sock", resNIC, nil, healthy("n0"), healthy("n1"))

	t.Run("insufficient", func(t *testing.T) {
		for i := range 8 {
			uid := fmt.Sprintf("bad%d", i)
			err := e.allocate(pod(uid, ctr("c", resGPU, 1, resNIC, 3)), "c")
			require.Error(t, err)
			assert.ErrorIs(t, err, devicemanager.ErrInsufficientDevices)
			assert.Empty(t, e.mgr.GetDevices(uid, "c"), "partial admission left records")
		}
	})
	t.Run("plugin error", func(t *testing.T) {
		nic.setAllocate(func(context.Context, *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
			return nil, errors.New("nic down")
		})
		for i := range 8 {
			uid := fmt.Sprintf("err%d", i)
			err := e.allocate(pod(uid, ctr("c", resGPU, 1, resNIC, 1)), "c")
			require.Error(t, err)
			assert.ErrorIs(t, err, devicemanager.ErrPluginCall)
			assert.Empty(t, e.mgr.GetDevices(uid, "c"), "partial admission left records")
		}
		nic.setAllocate(nil)
	})
	entries, _ := readCheckpoint(t, e.dir)
	for _, en := range entries {
		assert.False(t, strings.HasPrefix(en.PodUID, "bad") || strings.HasPrefix(en.PodUID, "err"), "failed admission in checkpoint: %+v", en)
	}
	require.NoError(t, e.allocate(pod("ok", ctr("c", resGPU, 2, resNIC, 2)), "c"), "devices leaked by failed admissions")
	assert.NotEmpty(t, gpu.allocateCalls())
}

// Options.CallTimeout bounds the plugin's Allocate (the kubelet waits as long
// as the caller's context allows). The timeout also bounds the allocation
// that must succeed afterwards, so it is not short.
func TestAllocateCallTimeout(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.CallTimeout = time.Second })
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"))
	pl.setAllocate(func(ctx context.Context, _ *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	done := make(chan error, 1)
	go func() { done <- e.allocate(pod("u1", ctr("c", resGPU, 1)), "c") }()
	var err error
	require.Eventually(t, func() bool {
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	}, waitFor, tick, "Allocate did not honour CallTimeout")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrPluginCall)
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	pl.setAllocate(nil)
	require.NoError(t, e.allocate(pod("u2", ctr("c", resGPU, 1)), "c"))
}

// The manager does not hold its lock across the plugin's Allocate: a hung
// plugin stalls only its own resource, and the devices reserved for the
// pending call are not handed to anyone else.
func TestHungPluginStallsOnlyItsResource(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	gpu := e.plugin(t, "g.sock", resGPU, nil, healthy("g0"), healthy("g1"))
	e.plugin(t, "n.sock", resNIC, nil, healthy("n0"))
	release := make(chan struct{})
	first := true
	gpu.setAllocate(func(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		gpu.mu.Lock()
		block := first
		first = false
		gpu.mu.Unlock()
		if block {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{{}}}, nil
	})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()

	p1 := pod("u1", ctr("c", resGPU, 1))
	p2 := pod("u2", ctr("c", resNIC, 1))
	p3 := pod("u3", ctr("c", resGPU, 1))
	e.pods.set(p1, p2, p3)
	hung := make(chan error, 1)
	go func() { hung <- e.mgr.Allocate(context.Background(), p1, &p1.Spec.Containers[0]) }()
	require.Eventually(t, func() bool { return len(gpu.allocateCalls()) == 1 }, waitFor, tick)

	others := make(chan error, 2)
	go func() {
		others <- e.mgr.Allocate(context.Background(), p2, &p2.Spec.Containers[0])
		_, _, _ = e.mgr.GetCapacity()
		others <- e.mgr.Allocate(context.Background(), p3, &p3.Spec.Containers[0])
	}()
	for range 2 {
		select {
		case err := <-others:
			require.NoError(t, err)
		case <-time.After(waitFor):
			t.Fatal("a hung plugin Allocate blocked other admissions")
		}
	}
	close(release)
	released = true
	require.NoError(t, <-hung)
	a, b := ids(e.mgr, "u1", "c", resGPU), ids(e.mgr, "u3", "c", resGPU)
	require.Len(t, a, 1)
	require.Len(t, b, 1)
	assert.NotEqual(t, a, b, "the pending reservation was handed out twice")
}

// Devices of regular init containers are reused by the containers after
// them: each init container's set contains the app containers' sets, and
// the app containers' sets are disjoint.
func TestInitContainerReuse(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	e.plugin(t, "g.sock", resGPU, nil, healthy("a"), healthy("b"), healthy("c"), healthy("d"))
	e.plugin(t, "n.sock", resNIC, nil, healthy("n0"), healthy("n1"))
	p := pod("u1", ctr("app1", resGPU, 1, resNIC, 1), ctr("app2", resGPU, 1, resNIC, 1))
	p.Spec.InitContainers = []v1.Container{ctr("init1", resGPU, 1), ctr("init2", resGPU, 2)}
	for _, c := range []string{"init1", "init2", "app1", "app2"} {
		require.NoError(t, e.allocate(p, c), c)
	}
	init1 := sets.New(ids(e.mgr, "u1", "init1", resGPU)...)
	init2 := sets.New(ids(e.mgr, "u1", "init2", resGPU)...)
	app1 := sets.New(ids(e.mgr, "u1", "app1", resGPU)...)
	app2 := sets.New(ids(e.mgr, "u1", "app2", resGPU)...)
	assert.Equal(t, 1, init1.Len())
	assert.Equal(t, 2, init2.Len())
	assert.Equal(t, 1, app1.Len())
	assert.Equal(t, 1, app2.Len())
	assert.True(t, init2.IsSuperset(init1))
	assert.True(t, init2.IsSuperset(app1))
	assert.True(t, init2.IsSuperset(app2))
	assert.Empty(t, app1.Intersection(app2))
	// Only two gpus are used; another pod gets the other two.
	require.NoError(t, e.allocate(pod("u2", ctr("c", resGPU, 2)), "c"))
}

// Sidecars (restartable init containers) may take devices of a regular init
// container before them, but keep theirs: sidecars and app containers never
// share a device.
func TestSidecarReuse(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	var devs []*pluginapi.Device
	for i := range 6 {
		devs = append(devs, healthy(fmt.Sprintf("d%d", i)))
	}
	e.plugin(t, "g.sock", resGPU, nil, devs...)
	p := pod("u1", ctr("app1", resGPU, 1), ctr("app2", resGPU, 2))
	p.Spec.InitContainers = []v1.Container{ctr("init", resGPU, 3), sidecar(ctr("sideA", resGPU, 1)), sidecar(ctr("sideB", resGPU, 2))}
	for _, c := range []string{"init", "sideA", "sideB", "app1", "app2"} {
		require.NoError(t, e.allocate(p, c), c)
	}
	get := func(c string) sets.Set[string] { return sets.New(ids(e.mgr, "u1", c, resGPU)...) }
	initS, a, b, x, y := get("init"), get("sideA"), get("sideB"), get("app1"), get("app2")
	assert.Equal(t, []int{3, 1, 2, 1, 2}, []int{initS.Len(), a.Len(), b.Len(), x.Len(), y.Len()})
	assert.True(t, initS.IsSuperset(a))
	assert.True(t, initS.IsSuperset(b))
	all := []sets.Set[string]{a, b, x, y}
	for i := range all {
		for j := i + 1; j < len(all); j++ {
			assert.Empty(t, all[i].Intersection(all[j]), "containers %d and %d share devices", i, j)
		}
	}
}

// What GetPreferredAllocation is asked: the candidate devices (sorted), the
// devices already picked as must-include, and the full request as the size;
// what it answers is honoured where it names candidates.
func TestGetPreferredAllocationParameters(t *testing.T) {
	prefOpts := &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}

	t.Run("fresh request", func(t *testing.T) {
		e := newEnv(t, nil)
		e.start(t)
		pl := e.plugin(t, "p.sock", resGPU, prefOpts, fourGPUs()...)
		pl.setPreferred(func(context.Context, *pluginapi.ContainerPreferredAllocationRequest) ([]string, error) {
			return []string{"d2"}, nil
		})
		require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 1)), "c"))
		calls := pl.preferredCalls()
		require.Len(t, calls, 1)
		require.Len(t, calls[0].ContainerRequests, 1)
		r := calls[0].ContainerRequests[0]
		assert.Equal(t, []string{"d0", "d1", "d2", "d3"}, r.AvailableDeviceIDs, "available (sorted)")
		assert.Empty(t, r.MustIncludeDeviceIDs)
		assert.Equal(t, int32(1), r.AllocationSize)
		assert.Equal(t, []string{"d2"}, ids(e.mgr, "u1", "c", resGPU), "preference not honoured")
	})

	t.Run("bogus and short preferences", func(t *testing.T) {
		e := newEnv(t, nil)
		e.start(t)
		pl := e.plugin(t, "p.sock", resGPU, prefOpts, fourGPUs()...)
		pl.setPreferred(func(context.Context, *pluginapi.ContainerPreferredAllocationRequest) ([]string, error) {
			return []string{"bogus", "d3"}, nil
		})
		require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 3)), "c"))
		got := ids(e.mgr, "u1", "c", resGPU)
		assert.Len(t, got, 3)
		assert.Contains(t, got, "d3")
		assert.NotContains(t, got, "bogus")
	})

	// The kubelet fails the admission when GetPreferredAllocation fails;
	// devmgr logs it and allocates without a preference, since the answer
	// is only a hint (NVIDIA k8s-device-plugin #231: one broken card failed
	// every pod on the node).
	t.Run("preferred rpc error", func(t *testing.T) {
		e := newEnv(t, nil)
		e.start(t)
		pl := e.plugin(t, "p.sock", resGPU, prefOpts, fourGPUs()...)
		pl.setPreferred(func(context.Context, *pluginapi.ContainerPreferredAllocationRequest) ([]string, error) {
			return nil, errors.New("no preference today")
		})
		require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 1)), "c"))
		assert.Len(t, pl.preferredCalls(), 1)
		assert.Len(t, pl.allocateCalls(), 1)
		assert.Len(t, ids(e.mgr, "u1", "c", resGPU), 1)
		pl.setPreferred(nil)
		require.NoError(t, e.allocate(pod("u2", ctr("c", resGPU, 3)), "c"), "the other three are free")
	})

	t.Run("with reuse pool", func(t *testing.T) {
		e := newEnv(t, nil)
		e.start(t)
		pl := e.plugin(t, "p.sock", resGPU, prefOpts, fourGPUs()...)
		p := pod("u1", ctr("app", resGPU, 3))
		p.Spec.InitContainers = []v1.Container{ctr("init", resGPU, 2)}
		require.NoError(t, e.allocate(p, "init"))
		initIDs := ids(e.mgr, "u1", "init", resGPU)
		require.NoError(t, e.allocate(p, "app"))
		calls := pl.preferredCalls()
		require.Len(t, calls, 2)
		r := calls[1].ContainerRequests[0]
		assert.Equal(t, []string{"d0", "d1", "d2", "d3"}, r.AvailableDeviceIDs)
		assert.Equal(t, initIDs, r.MustIncludeDeviceIDs)
		assert.Equal(t, int32(3), r.AllocationSize, "size is the full request")
		assert.True(t, sets.New(ids(e.mgr, "u1", "app", resGPU)...).IsSuperset(sets.New(initIDs...)))
	})
}

// fixedAffinity is an AffinityStore giving every container the same hint.
type fixedAffinity struct{ nodes []int }

func (f fixedAffinity) GetAffinity(string, string) topologyHint {
	return hintOf(true, f.nodes...)
}

// Selection with an AffinityStore, in the kubelet's order: when fewer
// devices are needed than the affinity's nodes offer, the plugin chooses
// among those; otherwise all of them are taken first and the plugin, then
// the devices on other nodes, then those without topology, fill the rest.
func TestAlignedAllocation(t *testing.T) {
	devs := []*pluginapi.Device{
		healthy("n0a", 0), healthy("n0b", 0), healthy("n0c", 0),
		healthy("n1a", 1), healthy("n1b", 1), healthy("none"),
	}
	prefOpts := &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
	setup := func(t *testing.T, nodes ...int) (*env, *fakePlugin) {
		e := newEnv(t, func(o *devicemanager.Options) {
			o.NUMANodes = []int{0, 1}
			o.AffinityStore = fixedAffinity{nodes: nodes}
		})
		e.start(t)
		return e, e.plugin(t, "p.sock", resGPU, prefOpts, devs...)
	}

	t.Run("needed < aligned: plugin asked among aligned", func(t *testing.T) {
		e, pl := setup(t, 0)
		pl.setPreferred(func(context.Context, *pluginapi.ContainerPreferredAllocationRequest) ([]string, error) {
			return []string{"n1a", "n0c"}, nil
		})
		require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 2)), "c"))
		got := ids(e.mgr, "u1", "c", resGPU)
		assert.Len(t, got, 2)
		assert.Contains(t, got, "n0c")
		assert.Subset(t, []string{"n0a", "n0b", "n0c"}, got)
		calls := pl.preferredCalls()
		require.Len(t, calls, 1)
		r := calls[0].ContainerRequests[0]
		assert.Equal(t, []string{"n0a", "n0b", "n0c"}, r.AvailableDeviceIDs)
		assert.Empty(t, r.MustIncludeDeviceIDs)
		assert.Equal(t, int32(2), r.AllocationSize)
	})
	t.Run("needed == aligned: plugin not asked", func(t *testing.T) {
		e, pl := setup(t, 1)
		require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 2)), "c"))
		assert.Equal(t, []string{"n1a", "n1b"}, ids(e.mgr, "u1", "c", resGPU))
		assert.Empty(t, pl.preferredCalls())
	})
	t.Run("needed > aligned: aligned first, then the plugin", func(t *testing.T) {
		e, pl := setup(t, 1)
		pl.setPreferred(func(context.Context, *pluginapi.ContainerPreferredAllocationRequest) ([]string, error) {
			return []string{"n1a", "n1b", "none"}, nil
		})
		require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 3)), "c"))
		assert.Equal(t, []string{"n1a", "n1b", "none"}, ids(e.mgr, "u1", "c", resGPU))
		calls := pl.preferredCalls()
		require.Len(t, calls, 1)
		r := calls[0].ContainerRequests[0]
		assert.Equal(t, []string{"n0a", "n0b", "n0c", "n1a", "n1b", "none"}, r.AvailableDeviceIDs)
		assert.Equal(t, []string{"n1a", "n1b"}, r.MustIncludeDeviceIDs)
		assert.Equal(t, int32(3), r.AllocationSize)
	})
	t.Run("no plugin preference: unaligned before no-topology", func(t *testing.T) {
		e, _ := setup(t, 1)
		require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 5)), "c"))
		got := ids(e.mgr, "u1", "c", resGPU)
		assert.Equal(t, []string{"n0a", "n0b", "n0c", "n1a", "n1b"}, got)
	})
	t.Run("numa map recorded", func(t *testing.T) {
		e, _ := setup(t, 1)
		require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 6)), "c"))
		got := e.mgr.GetDevices("u1", "c")[resGPU]
		require.Len(t, got, 6)
		assert.Nil(t, got["none"].GetTopology(), "a device without topology is reported with nil topology")
		require.NotNil(t, got["n1a"].GetTopology())
		assert.Equal(t, int64(1), got["n1a"].Topology.Nodes[0].ID)
	})
}

// Every ID list sent to a plugin is sorted (the kubelet sends map order), so
// the same state always makes the same calls.
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

// Only limits count: a request without a limit asks for no device.
func TestAllocateIgnoresRequestsWithoutLimits(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"))
	p := pod("u1", ctr("c"))
	p.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceName(resGPU): resource.MustParse("1")}
	require.NoError(t, e.allocate(p, "c"))
	assert.Empty(t, pl.allocateCalls())
}

// An extended resource that the pod's status maps to a DRA claim, for this
// container, is left to DRA: no device-plugin allocation.
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

// Allocate first garbage-collects pods that are no longer active, so their
// devices can be given out.
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

// The reuse pool only holds the pod being admitted: admitting another pod in
// between empties it, so A's app does not get A's init device.
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

// "Requested" in the refusal is what remains to find after the reused
// devices, as in the kubelet's message.
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

// When the plugin prefers more devices than needed, a subset of them is
// taken.
func TestPreferredMoreThanNeededTakesASubset(t *testing.T) {
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

// Only the first container response of the plugin's answer is used.
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

// A hung GetPreferredAllocation stalls only its own resource.
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
