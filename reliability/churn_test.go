//go:build reliability

package reliability

import (
	"fmt"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"

	"github.com/openkubelet/devmgr/internal/fdcheck"
)

// churnDevices is the number of devices of the churned plugin; each cycle's
// pod takes churnRequest of them, and the previous cycle's pod still holds
// as many while the next one is admitted.
const (
	churnDevices = 8
	churnRequest = 3
)

// Churn: -cycles times, a plugin process starts, registers, serves an
// admission, registers again on its socket (a restart of its gRPC server),
// and is SIGKILLed; the next cycle's process registers on the socket the
// dead one left behind. The manager runs throughout. After every cycle the
// capacity is exact (all devices, none allocatable once the plugin is dead)
// and every pod still active keeps its devices; at the end no goroutine and
// no file descriptor is left behind (runtime.NumGoroutine settled with a
// deadline, /proc/self/fd, and goleak).
func TestChurn(t *testing.T) {
	fig := Figures{Category: "churn"}
	fig.param("cycles asked", *cycles)
	defer recordOnExit(t, &fig, time.Now())
	r := newRig(t).start()
	cfg := childConfig{resource: resGPU, endpoint: "churn.sock", devices: churnDevices}

	// One cycle before the baseline, so that what the process starts once
	// and keeps (gRPC's and os/exec's lazily started helpers) is in it.
	warm := r.startChild(cfg)
	warm.expect(lineReady)
	r.waitCapacity(resGPU, churnDevices, churnDevices)
	warm.kill()
	r.waitCapacity(resGPU, churnDevices, 0)

	leaks := newLeakCheck(t)
	baseGoroutines := settledGoroutines(runtime.NumGoroutine())
	baseFDs := len(fdcheck.Snapshot(t))
	start := time.Now()
	var prev *v1.Pod
	maxGoroutines, maxFDs := baseGoroutines, baseFDs
	for i := range *cycles {
		var peak churnPeak
		ok := churnCycle(t, r, cfg, i, &prev, &peak)
		if !ok {
			break
		}
		fig.Cases++
		// A crash is counted when it happened: the plugin process ended
		// by SIGKILL, and the manager saw it go (churnCycle waits for
		// its devices to be unallocatable).
		if peak.killed {
			fig.Kills++
		}
		maxGoroutines = max(maxGoroutines, peak.goroutines)
		maxFDs = max(maxFDs, peak.fds)
		l, d := r.audit()
		fig.Lost += l
		fig.Doubled += d
	}
	fig.Elapsed = time.Since(start).Round(time.Millisecond).String()
	fig.Faults = fig.Kills
	assert.Equal(t, *cycles, fig.Cases, "cycles that went through")
	assert.Equal(t, fig.Cases, fig.Kills, "plugin processes that ended by SIGKILL, one per cycle")
	if prev != nil {
		r.release(prev)
	}
	// The last plugin is dead: the resource is visible, nothing allocatable,
	// nothing allocated.
	c, a := r.capacity(resGPU)
	assert.Equal(t, []int64{churnDevices, 0}, []int64{c, a})
	assert.Empty(t, r.m.GetDevices(fmt.Sprintf("churn-%d", *cycles-1), "c"))

	// A plugin serving costs goroutines and file descriptors (so the
	// counts below can see a leak); after the cycles none is left.
	endGoroutines := settledGoroutines(baseGoroutines)
	endFDs := len(fdcheck.Snapshot(t))
	fig.atLeast(t, "goroutines at most while a plugin serves, beyond the baseline", maxGoroutines-baseGoroutines, 1)
	fig.atLeast(t, "fds at most while a plugin serves, beyond the baseline", maxFDs-baseFDs, 1)
	fig.exact(t, "goroutines after the cycles (settled), beyond the baseline", max(0, endGoroutines-baseGoroutines), 0)
	fig.exact(t, "fds after the cycles, beyond the baseline", max(0, endFDs-baseFDs), 0)
	fdLeaks, goroutineLeaks := leaks.verify(t)
	fig.exact(t, "leaked fds (leak check)", fdLeaks, 0)
	fig.exact(t, "leaked goroutines (leak check)", goroutineLeaks, 0)

	// Back for a last time: every device is free.
	final := r.startChild(cfg)
	final.expect(lineReady)
	r.waitCapacity(resGPU, churnDevices, churnDevices)
	requireAllFreeChurn(t, r)
	final.stop() // a clean exit this time
	r.waitCapacity(resGPU, churnDevices, 0)
	r.shutdown()
}

// churnPeak is what the process holds while a cycle's plugin serves, and
// whether the plugin process then ended by SIGKILL.
type churnPeak struct {
	goroutines, fds int
	killed          bool
}

// churnCycle runs cycle i: start, register, admit, re-register, kill. prev
// is the previous cycle's pod, released once this cycle's pod is admitted.
// It reports whether the cycle went through.
func churnCycle(t *testing.T, r *rig, cfg childConfig, i int, prev **v1.Pod, peak *churnPeak) bool {
	parent := r.t
	defer func() { r.t = parent }()
	return t.Run(fmt.Sprintf("cycle %d", i), func(t *testing.T) {
		r.t = t // failures of the rig's helpers go to this cycle
		c := r.startChild(cfg)
		c.expect(lineReady)
		r.waitCapacity(resGPU, churnDevices, churnDevices)

		pod := podOf(fmt.Sprintf("churn-%d", i), resGPU, churnRequest)
		require.NoError(t, r.admit(pod))
		held := r.held(pod, resGPU)
		require.Len(t, held, churnRequest)
		if *prev != nil {
			for _, id := range r.held(*prev, resGPU) {
				assert.NotContains(t, held, id, "a device of the previous cycle's pod, which survived its plugin's crash")
			}
			r.release(*prev)
		}
		*prev = pod

		c.reregister()
		r.waitCapacity(resGPU, churnDevices, churnDevices)
		peak.goroutines, peak.fds = runtime.NumGoroutine(), len(fdcheck.Snapshot(t))
		c.kill()
		peak.killed = c.killedBy(syscall.SIGKILL)
		r.waitCapacity(resGPU, churnDevices, 0)
		assert.Equal(t, held, r.held(pod, resGPU), "the allocation outlives its plugin")
	})
}

// requireAllFreeChurn admits a pod asking every churned device.
func requireAllFreeChurn(t *testing.T, r *rig) {
	t.Helper()
	pod := podOf("churn-all", resGPU, churnDevices)
	require.NoError(t, r.admit(pod), "every device is free once every churn pod is gone")
	got := r.held(pod, resGPU)
	want := make([]string, churnDevices)
	for i := range want {
		want[i] = fmt.Sprintf("d%d", i)
	}
	slices.Sort(want)
	assert.Equal(t, want, got)
}
