//go:build reliability

package reliability

import (
	"fmt"
	"runtime"
	"slices"
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
	fig := Figures{Category: "churn", Details: map[string]any{"cycles asked": *cycles}}
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
		fig.Kills++
		fig.Faults++
		maxGoroutines = max(maxGoroutines, peak.goroutines)
		maxFDs = max(maxFDs, peak.fds)
		l, d := r.audit()
		fig.Lost += l
		fig.Doubled += d
	}
	fig.Elapsed = time.Since(start).Round(time.Millisecond).String()
	if prev != nil {
		r.release(prev)
	}
	// The last plugin is dead: the resource is visible, nothing allocatable,
	// nothing allocated.
	c, a := r.capacity(resGPU)
	assert.Equal(t, []int64{churnDevices, 0}, []int64{c, a})
	assert.Empty(t, r.m.GetDevices(fmt.Sprintf("churn-%d", *cycles-1), "c"))

	endGoroutines := settledGoroutines(baseGoroutines)
	endFDs := len(fdcheck.Snapshot(t))
	assert.LessOrEqual(t, endGoroutines, baseGoroutines, "goroutines left behind by %d cycles", fig.Cases)
	fdLeaks, goroutineLeaks := leaks.verify(t)
	assert.LessOrEqual(t, endFDs, baseFDs, "file descriptors left behind by %d cycles", fig.Cases)
	fig.Details["goroutines before"] = baseGoroutines
	fig.Details["goroutines after (settled)"] = endGoroutines
	fig.Details["goroutines at most, plugin serving"] = maxGoroutines
	fig.Details["fds before"] = baseFDs
	fig.Details["fds after"] = endFDs
	fig.Details["fds at most, plugin serving"] = maxFDs
	fig.Details["leaked fds (leak check)"] = fdLeaks
	fig.Details["leaked goroutines (leak check)"] = goroutineLeaks

	// Back for a last time: every device is free.
	final := r.startChild(cfg)
	final.expect(lineReady)
	r.waitCapacity(resGPU, churnDevices, churnDevices)
	requireAllFreeChurn(t, r)
	final.stop() // a clean exit this time
	r.waitCapacity(resGPU, churnDevices, 0)
	r.shutdown()
}

// churnPeak is what the process holds while a cycle's plugin serves.
type churnPeak struct{ goroutines, fds int }

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
