package blackbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
)

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
