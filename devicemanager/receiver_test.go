package devicemanager

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
)

const resRecv = "example.com/recv"

// A list handed to PluginListAndWatchReceiver is in force when the call
// returns: capacity, the owners on Updates and the checkpoint on disk, with
// no waiting. The plugin's own stream keeps applying its lists afterwards.
func TestPluginListAndWatchReceiverAppliesBeforeReturning(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(resRecv, devices("r", 4))
	pod := newPod("p1", ctr("c", resRecv, 1))
	require.NoError(t, h.admit(pod))
	held := h.held(pod, "c", resRecv)
	require.Len(t, held, 1)

	list := devices("r", 4)
	for _, d := range list {
		if d.ID == held[0] {
			d.Health = pluginapi.Unhealthy
		}
	}
	h.m.PluginListAndWatchReceiver(h.opts.Logger, resRecv, &pluginapi.ListAndWatchResponse{Devices: list})

	c, a := h.capacity(resRecv)
	assert.Equal(t, []int64{4, 3}, []int64{c, a}, "capacity/allocatable right after the call")
	_, registered := readCheckpointFile(t, h.dir)
	assert.NotContains(t, registered[resRecv], held[0], "the checkpoint names only healthy devices")
	assert.Len(t, registered[resRecv], 3)
	assert.Equal(t, []string{"p1"}, h.nextUpdate().PodUIDs, "the owner of the device that turned unhealthy")
	status := h.m.GetAllocatableDevices()[resRecv]
	assert.NotContains(t, status, held[0])

	// The stream still counts: the plugin's next list wins.
	p.Update(devices("r", 4))
	h.waitCapacity(resRecv, 4, 4)
}

// A list for a resource nobody serves changes nothing: not an unknown
// resource, not one whose plugin is gone, and not a nil response.
func TestPluginListAndWatchReceiverIgnoresResourcesWithoutPlugin(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	h := newHarness(t).start()
	p := h.registered(resRecv, devices("r", 2))
	var before []byte
	h.eventually(func() bool { // the stream's list is visible before it is on disk
		var err error
		before, err = os.ReadFile(checkpointFile(h.dir))
		return err == nil
	}, "the checkpoint of the plugin's first list")

	h.m.PluginListAndWatchReceiver(logger, "example.com/nobody", &pluginapi.ListAndWatchResponse{Devices: devices("n", 3)})
	c, _ := h.capacity("example.com/nobody")
	assert.Equal(t, int64(-1), c, "an unknown resource stays out of capacity")
	assert.NotContains(t, h.m.GetAllocatableDevices(), "example.com/nobody")

	h.m.PluginListAndWatchReceiver(logger, resRecv, nil)
	h.waitCapacity(resRecv, 2, 2)

	p.Stop() // the stream ends: devices unhealthy, resource kept for the grace period
	h.waitCapacity(resRecv, 2, 0)
	h.m.PluginListAndWatchReceiver(logger, resRecv, &pluginapi.ListAndWatchResponse{Devices: devices("r", 2)})
	c, a := h.capacity(resRecv)
	assert.Equal(t, []int64{2, 0}, []int64{c, a}, "a gone plugin's devices stay unhealthy")

	after, err := os.ReadFile(checkpointFile(h.dir))
	require.NoError(t, err)
	assert.Equal(t, before, after, "no checkpoint write for ignored lists")

	// A zero logger is allowed, as with the kubelet's method.
	h.m.PluginListAndWatchReceiver(klog.Logger{}, "example.com/nobody", nil)
}

// Lists from the receiver and from the plugin's stream, concurrently, leave
// one of the lists in force, whole: the device sets, capacity and checkpoint
// agree with each other. Run with -race.
func TestPluginListAndWatchReceiverConcurrentWithStream(t *testing.T) {
	h := newHarness(t).start()
	const n = 50
	p := h.registered(resRecv, devices("r", n))
	lists := make([][]*pluginapi.Device, 4)
	for k := range lists {
		lists[k] = devices("r", n)
		for i := 0; i < k*10; i++ {
			lists[k][i].Health = pluginapi.Unhealthy
		}
	}
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := range 40 {
				l := lists[(i+w)%len(lists)]
				h.m.PluginListAndWatchReceiver(h.opts.Logger, resRecv, &pluginapi.ListAndWatchResponse{Devices: l})
			}
		})
	}
	for i := range 40 {
		p.Update(lists[i%len(lists)])
	}
	wg.Wait()
	// The stream's last list, sent after every receiver call has returned,
	// settles the state; its healthy count is unlike any list before it.
	last := devices("r", n)
	last[n-1].Health = pluginapi.Unhealthy
	p.Update(last)
	h.waitCapacity(resRecv, n, int64(countHealthy(last)))
	var registered map[string][]string
	h.eventually(func() bool {
		_, registered = readCheckpointFile(t, h.dir)
		return len(registered[resRecv]) == countHealthy(last)
	}, "checkpoint names the %d healthy devices", countHealthy(last))
	for _, id := range registered[resRecv] {
		assert.Contains(t, h.m.GetAllocatableDevices()[resRecv], id)
	}
	assert.Len(t, h.m.GetAllocatableDevices()[resRecv], countHealthy(last), fmt.Sprint(registered[resRecv]))
}

func checkpointFile(dir string) string { return filepath.Join(dir, checkpoint.DeviceManagerKey) }

// Stop waits for receiver calls in progress, so the checkpoint is never
// written after Stop returns; calls after Stop are ignored.
func TestPluginListAndWatchReceiverNoWriteAfterStop(t *testing.T) {
	for round := range 20 {
		h := newHarness(t, quiet).start()
		h.registered(resRecv, devices("r", 200))
		var calls atomic.Int64
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				l := devices("r", 200)
				for _, d := range l[:100*(i%2)] {
					d.Health = pluginapi.Unhealthy
				}
				h.m.PluginListAndWatchReceiver(logr.Discard(), resRecv, &pluginapi.ListAndWatchResponse{Devices: l})
				calls.Add(1)
			}
		})
		h.eventually(func() bool { return calls.Load() >= 3 }, "receiver calls")
		require.NoError(t, h.m.Stop())
		after := stampFile(t, checkpointFile(h.dir))
		close(done)
		wg.Wait()
		h.m.PluginListAndWatchReceiver(logr.Discard(), resRecv, &pluginapi.ListAndWatchResponse{Devices: devices("r", 1)})
		require.Equal(t, after, stampFile(t, checkpointFile(h.dir)), "round %d: checkpoint written after Stop returned", round)
	}
}

// stampFile identifies the file at path: inode, size and modification time.
func stampFile(t *testing.T, path string) string {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	st, ok := fi.Sys().(*syscall.Stat_t)
	require.True(t, ok)
	return fmt.Sprint(st.Ino, fi.Size(), fi.ModTime().UnixNano())
}
