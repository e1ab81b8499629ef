package blackbox_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/devicemanager"
)

// admission is what one worker of TestConcurrentAdmissionsNeverShareADevice
// saw for one pod.
type admission struct {
	uid     string
	want    int      // devices requested
	err     error    // what Allocate returned
	held    []string // the pod's devices right after the admission
	retired bool     // the worker took the pod out of the active list
}

// Admissions, garbage collections, health updates and every getter run at
// once, with more demand than devices. No device is ever held by two pods;
// an admission that succeeds holds exactly what it asked for, and its run
// options, status and hints describe those devices; a refusal is "not enough
// devices" and leaves nothing behind; capacity and allocatable stay whole;
// and at the end the manager counts as free exactly the devices that the
// live pods do not hold, in its answers and in its checkpoint.
func TestConcurrentAdmissionsNeverShareADevice(t *testing.T) {
	const (
		nDevices    = 40
		workers     = 4
		rounds      = 30 // admissions per worker
		retireEvery = 10 // a worker retires its live pods every retireEvery rounds
	)
	e := newEnv(t, func(o *devicemanager.Options) { o.NUMANodes = []int{0, 1} })
	e.start(t)
	var devs []*pluginapi.Device
	for i := range nDevices {
		devs = append(devs, healthy(fmt.Sprintf("d%02d", i), int64(i%2)))
	}
	allIDs := make([]string, 0, nDevices)
	for _, d := range devs {
		allIDs = append(allIDs, d.ID)
	}
	pl := e.plugin(t, "p.sock", resGPU, nil, devs...)

	// owner is the test's own account of who holds each device. A pod's
	// devices enter it once its admission returns, and leave it before the
	// pod leaves the active list: only from then on may the manager hand
	// them to someone else. A device found in another pod's hands while it
	// is still in owner was given out twice.
	var ownerMu sync.Mutex
	owner := map[string]string{}
	claim := func(uid string, held []string) {
		ownerMu.Lock()
		defer ownerMu.Unlock()
		for _, id := range held {
			if prev, taken := owner[id]; taken {
				assert.Failf(t, "device held twice", "%s was given to %s while %s holds it", id, uid, prev)
			}
			owner[id] = uid
		}
	}
	retire := func(live []*admission) {
		ownerMu.Lock()
		for _, a := range live {
			for _, id := range a.held {
				delete(owner, id)
			}
			a.retired = true
		}
		ownerMu.Unlock()
		uids := make([]string, 0, len(live))
		for _, a := range live {
			uids = append(uids, a.uid)
		}
		e.pods.remove(uids...)
	}

	var wg sync.WaitGroup
	// Health: one device at a time is reported unhealthy, so capacity is
	// always nDevices and allocatable nDevices or nDevices-1.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 20 {
			d := cloneDevices(devs)
			d[i].Health = pluginapi.Unhealthy
			pl.update(d...)
		}
	}()
	// Updates() is drained while the workers run; it may only name pods
	// that were admitted.
	notified := sets.New[string]()
	stopUpdates := make(chan struct{})
	updatesDone := make(chan struct{})
	go func() {
		defer close(updatesDone)
		for {
			select {
			case u := <-e.mgr.Updates():
				notified.Insert(u.PodUIDs...)
			case <-stopUpdates:
				return
			}
		}
	}()

	results := make([][]*admission, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var live []*admission
			for i := range rounds {
				if i > 0 && i%retireEvery == 0 {
					retire(live)
					e.mgr.UpdateAllocatedDevices()
					for _, a := range live {
						assert.Empty(t, e.mgr.GetDevices(a.uid, "c"), "%s still holds devices after it left and GC ran", a.uid)
					}
					live = nil
				}
				a := &admission{uid: fmt.Sprintf("w%d-%02d", w, i), want: i%3 + 1}
				results[w] = append(results[w], a)
				p := pod(a.uid, ctr("c", resGPU, a.want))
				a.err = e.allocate(p, "c")
				a.held = ids(e.mgr, a.uid, "c", resGPU)

				c, al, _ := e.mgr.GetCapacity()
				cq, aq := c[v1.ResourceName(resGPU)], al[v1.ResourceName(resGPU)]
				assert.Equal(t, int64(nDevices), cq.Value(), "capacity")
				assert.Contains(t, []int64{nDevices - 1, nDevices}, aq.Value(), "allocatable")
				assert.Contains(t, []int{nDevices - 1, nDevices}, len(e.mgr.GetAllocatableDevices()[resGPU]), "allocatable devices")
				assert.Contains(t, e.mgr.GetPodTopologyHints(p), resGPU)
				hints := e.mgr.GetTopologyHints(p, &p.Spec.Containers[0])
				assert.Contains(t, hints, resGPU)
				st := &v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: "c"}}}
				e.mgr.UpdateAllocatedResourcesStatus(p, st)
				_ = e.mgr.UpdatePluginResources(v1.ResourceList{}, p)

				if a.err != nil {
					assert.ErrorIs(t, a.err, devicemanager.ErrInsufficientDevices, "%s", a.uid)
					assert.Empty(t, a.held, "%s was refused but holds devices", a.uid)
					assert.Empty(t, st.ContainerStatuses[0].AllocatedResourcesStatus, "%s", a.uid)
					continue
				}
				if !assert.Len(t, a.held, a.want, "%s", a.uid) {
					continue
				}
				claim(a.uid, a.held)
				live = append(live, a)
				assert.NotEmpty(t, hints[resGPU], "%s: no hint for the devices it holds", a.uid)
				opts, err := e.runOptions(p, "c")
				if assert.NoError(t, err, "%s", a.uid) && assert.NotNil(t, opts, "%s", a.uid) {
					assert.Equal(t, []devicemanager.EnvVar{{Name: "DEVICES_vendor_com_gpu", Value: strings.Join(a.held, ",")}}, opts.Envs,
						"%s: the plugin's answer is not for the devices it holds", a.uid)
				}
				if rs := st.ContainerStatuses[0].AllocatedResourcesStatus; assert.Len(t, rs, 1, "%s", a.uid) {
					var got []string
					for _, h := range rs[0].Resources {
						got = append(got, string(h.ResourceID))
					}
					assert.Equal(t, a.held, sortedCopy(got), "%s: status lists other devices", a.uid)
				}
			}
		}()
	}
	wg.Wait()
	close(stopUpdates)
	<-updatesDone

	// The plugin's last list (d19 unhealthy) is applied before going on.
	e.waitAllocatable(t, resGPU, slices.DeleteFunc(slices.Clone(allIDs), func(id string) bool { return id == "d19" })...)
	e.mgr.UpdateAllocatedDevices()

	admitted := sets.New[string]()
	live := map[string][]string{}
	var refused int
	for _, rs := range results {
		for _, a := range rs {
			got := ids(e.mgr, a.uid, "c", resGPU)
			switch {
			case a.err != nil:
				refused++
				assert.Empty(t, got, "refused %s holds devices", a.uid)
			case a.retired:
				admitted.Insert(a.uid)
				assert.Empty(t, got, "retired %s holds devices", a.uid)
			default:
				admitted.Insert(a.uid)
				live[a.uid] = a.held
				assert.Equal(t, a.held, got, "%s: devices changed after admission", a.uid)
			}
		}
	}
	// The last round of each worker asks for 21 devices and keeps them:
	// 84 > 40, so some admissions must have been refused.
	assert.NotZero(t, refused, "no admission was refused")
	require.NotEmpty(t, live, "no pod holds devices")
	assert.True(t, admitted.IsSuperset(notified), "Updates() named pods never admitted: %v", sets.List(notified.Difference(admitted)))
	holder := map[string]string{}
	for uid, held := range live {
		for _, id := range held {
			if prev, ok := holder[id]; ok {
				t.Errorf("device %s held by both %s and %s", id, prev, uid)
			}
			holder[id] = uid
		}
	}
	t.Logf("%d admitted, %d refused; %d live pods hold %d devices", admitted.Len(), refused, len(live), len(holder))

	// A change of the healthy set writes the checkpoint: it lists exactly
	// the live pods, each with its devices.
	pl.update(devs...)
	e.waitAllocatable(t, resGPU, allIDs...)
	var entries []checkpoint.PodDevicesEntry
	require.Eventually(t, func() bool {
		var reg map[string][]string
		var ok bool
		entries, reg, ok = tryReadCheckpoint(e.dir)
		return ok && len(reg[resGPU]) == nDevices
	}, waitFor, tick, "checkpoint not written after the healthy set changed")
	inFile := map[string][]string{}
	for _, en := range entries {
		require.Equal(t, "c", en.ContainerName)
		inEntry := sets.New[string]()
		for _, list := range en.DeviceIDs {
			inEntry.Insert(list...)
		}
		inFile[en.PodUID] = sets.List(inEntry)
	}
	assert.Equal(t, live, inFile, "checkpoint entries are not the live pods' devices")

	// The free devices are exactly those no live pod holds.
	free := nDevices - len(holder)
	over := pod("over", ctr("c", resGPU, free+1))
	err := e.allocate(over, "c")
	require.Error(t, err)
	assert.ErrorIs(t, err, devicemanager.ErrInsufficientDevices)
	assert.Contains(t, err.Error(), fmt.Sprintf("Requested: %d, Available: %d", free+1, free))
	assert.Empty(t, e.mgr.GetDevices("over", "c"))

	// With every live pod gone, one pod can take every device.
	var rest []*admission
	for uid, held := range live {
		rest = append(rest, &admission{uid: uid, held: held})
	}
	retire(rest)
	require.NoError(t, e.allocate(pod("all", ctr("c", resGPU, nDevices)), "c"))
	assert.Equal(t, allIDs, ids(e.mgr, "all", "c", resGPU))
	entries, _ = readCheckpoint(t, e.dir)
	require.Len(t, entries, 1)
	assert.Equal(t, "all", entries[0].PodUID)
}

// A pending reservation survives a garbage collection that rebuilds the
// in-use set while the plugin's Allocate is in flight (the kubelet can hand
// the same device to two pods there: upstream PR #137534).
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
