package main

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/openkubelet/devmgr/devicemanager"
)

// fakeWatched is a watchedManager whose answers the test sets.
type fakeWatched struct {
	mu       sync.Mutex
	status   []devicemanager.ResourceStatus
	capacity map[string][2]int64 // capacity, allocatable
	removed  []string
	updates  chan devicemanager.ResourceUpdate
}

func (f *fakeWatched) set(status []devicemanager.ResourceStatus, capacity map[string][2]int64, removed ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status, f.capacity, f.removed = status, capacity, removed
}

func (f *fakeWatched) Status() []devicemanager.ResourceStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status
}

func (f *fakeWatched) GetCapacity() (capacity, allocatable v1.ResourceList, removed []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	capacity, allocatable = v1.ResourceList{}, v1.ResourceList{}
	for name, c := range f.capacity {
		capacity[v1.ResourceName(name)] = *resource.NewQuantity(c[0], resource.DecimalSI)
		allocatable[v1.ResourceName(name)] = *resource.NewQuantity(c[1], resource.DecimalSI)
	}
	removed, f.removed = f.removed, nil
	return capacity, allocatable, removed
}

func (f *fakeWatched) Updates() <-chan devicemanager.ResourceUpdate { return f.updates }

// logLines collects log entries as JSON lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := strings.Join(l.lines, "\n")
	l.lines = nil
	return out
}

func TestWatcherLogsChanges(t *testing.T) {
	var logs logLines
	logger := funcr.NewJSON(func(obj string) {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		logs.lines = append(logs.lines, obj)
	}, funcr.Options{})
	f := &fakeWatched{updates: make(chan devicemanager.ResourceUpdate, 1)}
	w := &watcher{mgr: f, log: logger}
	ep := devicemanager.EndpointStatus{Resource: gpu, Socket: "/dp/gpu.sock", GetPreferredAllocationAvailable: true}
	dev := func(id, health string) devicemanager.DeviceStatus {
		return devicemanager.DeviceStatus{ID: id, Health: health}
	}

	// Restored from the checkpoint, no plugin yet.
	f.set([]devicemanager.ResourceStatus{{Name: gpu, Allocated: 1, RestoredFromCheckpoint: true}},
		map[string][2]int64{gpu: {0, 0}})
	w.poll()
	out := logs.take()
	assert.Contains(t, out, `"msg":"Resource restored from checkpoint; waiting for its device plugin","resourceName":"example.com/gpu","allocated":1`)
	assert.NotContains(t, out, "Capacity changed", "no capacity yet")

	// The plugin registers with two devices.
	f.set([]devicemanager.ResourceStatus{{Name: gpu, Capacity: 2, Allocatable: 2,
		Devices: []devicemanager.DeviceStatus{dev("a", "Healthy"), dev("b", "Healthy")}, Endpoints: []devicemanager.EndpointStatus{ep}}},
		map[string][2]int64{gpu: {2, 2}})
	w.poll()
	out = logs.take()
	assert.Contains(t, out, `"msg":"Device plugin registered","resourceName":"example.com/gpu","socketPath":"/dp/gpu.sock","preStartRequired":false,"getPreferredAllocationAvailable":true`)
	assert.Contains(t, out, `"msg":"Devices updated","resourceName":"example.com/gpu","devices":2,"healthy":2,"added":["a","b"]`)
	assert.Contains(t, out, `"capacity":2,"allocatable":2`)

	// Nothing changed: nothing logged.
	w.poll()
	assert.Empty(t, logs.take())

	// One device turns unhealthy, one is replaced.
	f.set([]devicemanager.ResourceStatus{{Name: gpu, Capacity: 2, Allocatable: 1,
		Devices: []devicemanager.DeviceStatus{dev("a", "Unhealthy"), dev("c", "Healthy")}, Endpoints: []devicemanager.EndpointStatus{ep}}},
		map[string][2]int64{gpu: {2, 1}})
	w.poll()
	out = logs.take()
	assert.Contains(t, out, `"devices":2,"healthy":1,"added":["c"],"removed":["b"],"nowUnhealthy":["a"]`)
	assert.Contains(t, out, `"capacity":2,"allocatable":1`)

	// The plugin goes, then its resource is retired.
	stopped := ep
	stopped.Stopped = true
	f.set([]devicemanager.ResourceStatus{{Name: gpu, Capacity: 2,
		Devices: []devicemanager.DeviceStatus{dev("a", "Unhealthy"), dev("c", "Unhealthy")}, Endpoints: []devicemanager.EndpointStatus{stopped}}},
		map[string][2]int64{gpu: {2, 0}})
	w.poll()
	out = logs.take()
	assert.Contains(t, out, `"msg":"Device plugin disconnected; its devices are unhealthy until it registers again","resourceName":"example.com/gpu","socketPath":"/dp/gpu.sock"`)
	assert.Contains(t, out, `"nowUnhealthy":["c"]`)
	f.set(nil, nil, gpu)
	w.poll()
	out = logs.take()
	assert.Contains(t, out, `"msg":"Removed resource: its device plugin has been gone longer than the grace period","resourceName":"example.com/gpu"`)
	assert.Contains(t, out, `"msg":"Capacity changed","resourceName":"example.com/gpu","capacity":0,"allocatable":0`)

	// run logs health updates of admitted pods' devices and stops with its
	// context.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx, time.Hour)
	}()
	f.updates <- devicemanager.ResourceUpdate{PodUIDs: []string{"u1"}}
	require.True(t, eventually(5*time.Second, nil, func() bool {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		return strings.Contains(strings.Join(logs.lines, "\n"), `"msg":"Devices of admitted pods changed health","podUIDs":["u1"]`)
	}))
	cancel()
	<-done
}

// At -v 2 the manager logs registrations and disconnections itself, so
// the watcher leaves them out; it still names the devices that changed.
func TestWatcherLeavesPluginEventsToTheManagerAtV2(t *testing.T) {
	var logs logLines
	logger := funcr.NewJSON(func(obj string) {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		logs.lines = append(logs.lines, obj)
	}, funcr.Options{Verbosity: 2})
	f := &fakeWatched{}
	w := &watcher{mgr: f, log: logger}
	ep := devicemanager.EndpointStatus{Resource: gpu, Socket: "/dp/gpu.sock"}
	devs := []devicemanager.DeviceStatus{{ID: "a", Health: "Healthy"}}
	f.set([]devicemanager.ResourceStatus{{Name: gpu, Capacity: 1, Allocatable: 1, Devices: devs,
		Endpoints: []devicemanager.EndpointStatus{ep}}}, map[string][2]int64{gpu: {1, 1}})
	w.poll()
	out := logs.take()
	assert.NotContains(t, out, "Device plugin registered")
	assert.Contains(t, out, `"msg":"Devices updated","resourceName":"example.com/gpu","devices":1,"healthy":1,"added":["a"]`)

	ep.Stopped = true
	f.set([]devicemanager.ResourceStatus{{Name: gpu, Capacity: 1, Devices: devs,
		Endpoints: []devicemanager.EndpointStatus{ep}}}, map[string][2]int64{gpu: {1, 0}})
	w.poll()
	out = logs.take()
	assert.NotContains(t, out, "Device plugin disconnected")
	assert.Contains(t, out, `"msg":"Capacity changed","resourceName":"example.com/gpu","capacity":1,"allocatable":0`)
}

// serve logs each event once, whatever -v: a plugin's registration and
// disconnection, the podresources server starting. Below -v 2 serve's own
// lines say it, from -v 2 the manager's and the podresources server's.
func TestServeLogsEachEventOnce(t *testing.T) {
	for _, v := range []string{"0", "2"} {
		t.Run("-v "+v, func(t *testing.T) {
			dir := shortTempDir(t)
			srv := startServe(t, filepath.Join(dir, "ctl.sock"), "--socket-dir", filepath.Join(dir, "dp"), "--numa-nodes", "0,1",
				"--podresources-socket", filepath.Join(dir, "pr.sock"), "-v", v)
			p := startPlugin(t, filepath.Join(dir, "dp"), gpus(2))
			// The watcher has seen the registration, then the disconnection.
			srv.waitLog(`"Capacity changed" resourceName="example.com/gpu" capacity=2 allocatable=2`)
			p.Stop()
			srv.waitLog(`"Capacity changed" resourceName="example.com/gpu" capacity=2 allocatable=0`)
			require.Equal(t, 0, srv.stop(syscall.SIGTERM))

			log := srv.log.String()
			for what, re := range map[string]string{
				"registration":  `"(Registered device plugin|Device plugin registered)" .*resourceName="example.com/gpu"`,
				"disconnection": `"Device plugin disconnected; its devices are unhealthy until it registers again"`,
				"podresources":  `"Serving (the )?podresources`,
			} {
				lines := regexp.MustCompile(`(?m)^.*`+re+`.*$`).FindAllString(log, -1)
				assert.Len(t, lines, 1, "%s lines at -v %s", what, v)
			}
			if v == "2" {
				assert.Contains(t, log, `"Registered device plugin" logger="devicemanager"`, "the manager's line, under its name once")
			}
		})
	}
}

func TestBriefShortensLongLists(t *testing.T) {
	ids := make([]string, 20)
	for i := range ids {
		ids[i] = "d"
	}
	got := brief(ids)
	assert.Len(t, got, briefLimit+1)
	assert.Equal(t, "... 4 more", got[briefLimit])
	assert.Len(t, ids, 20, "the input is left alone")
	assert.Equal(t, []string{"a"}, brief([]string{"a"}))
}
