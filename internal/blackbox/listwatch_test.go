package blackbox_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/devicemanager"
)

// Each ListAndWatch message replaces the resource's device set; "Healthy"
// (exactly) is healthy, anything else is not.
func TestListAndWatchReplacesDeviceSet(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	p := e.plugin(t, "p.sock", resGPU, nil, healthy("D1"), healthy("D2"), unhealthy("D3"))
	e.waitCapacity(t, resGPU, 3, 2)
	assert.Equal(t, []string{"D1", "D2"}, keys(e.mgr.GetAllocatableDevices()[resGPU]))

	p.update(healthy("D1"), healthy("D2"))
	e.waitCapacity(t, resGPU, 2, 2)

	p.update(healthy("D1"), unhealthy("D2"), healthy("D3"))
	e.waitCapacity(t, resGPU, 3, 2)
	assert.Equal(t, []string{"D1", "D3"}, keys(e.mgr.GetAllocatableDevices()[resGPU]))

	p.update(unhealthy("D2"), unhealthy("D3"))
	e.waitCapacity(t, resGPU, 2, 0)
	all := e.mgr.GetAllocatableDevices()
	inner, ok := all[resGPU]
	assert.True(t, ok, "a resource with known devices but none healthy keeps an (empty) entry")
	assert.Empty(t, inner)

	// Health strings other than exactly "Healthy" are unhealthy.
	p.update(dev("D1", "healthy"), dev("D2", ""), dev("D3", "Unknown"), healthy("D4"))
	e.waitCapacity(t, resGPU, 4, 1)

	// A second resource is independent.
	e.plugin(t, "q.sock", resNIC, nil, healthy("N1"), unhealthy("N2"), unhealthy("N3"))
	e.waitCapacity(t, resNIC, 3, 1)
	e.waitCapacity(t, resGPU, 4, 1)

	// The device objects handed out keep their topology.
	p.update(healthy("D1", 0), healthy("D2", 1))
	e.waitCapacity(t, resGPU, 2, 2)
	d := e.mgr.GetAllocatableDevices()[resGPU]["D2"]
	require.NotNil(t, d)
	require.NotNil(t, d.Topology)
	require.Len(t, d.Topology.Nodes, 1)
	assert.Equal(t, int64(1), d.Topology.Nodes[0].ID)
}

// Quantities in GetCapacity are DecimalSI.
func TestCapacityQuantityFormat(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	e.plugin(t, "p.sock", resGPU, nil, healthy("D1"), healthy("D2"), unhealthy("D3"))
	c, a, removed := e.mgr.GetCapacity()
	assert.Empty(t, removed)
	q := c["vendor.com/gpu"]
	assert.Equal(t, "3", q.String())
	qa := a["vendor.com/gpu"]
	assert.Equal(t, "2", qa.String())
}

// When the plugin disconnects its resource stays (allocatable 0) for the
// grace period; GetCapacity removes it once the period is strictly exceeded,
// reports it once, and rewrites the checkpoint. The disconnect itself
// writes nothing, as in the kubelet.
func TestGracePeriodRemovesResourceOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		grace time.Duration
		want  time.Duration
	}{
		{"option", time.Minute, time.Minute},
		{"default 5m", 0, 5 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(o *devicemanager.Options) { o.StopGracePeriod = tc.grace })
			e.start(t)
			p := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"), unhealthy("d2"))
			e.plugin(t, "q.sock", resNIC, nil, healthy("n0"))
			ckPath := filepath.Join(e.dir, checkpoint.DeviceManagerKey)
			require.Eventually(t, func() bool {
				_, reg, ok := tryReadCheckpoint(e.dir)
				return ok && slices.Equal(sortedCopy(reg[resGPU]), []string{"d0", "d1"}) && len(reg[resNIC]) == 1
			}, waitFor, tick)
			before := readFile(t, ckPath)

			p.stop()
			e.waitCapacity(t, resGPU, 3, 0)
			assert.Equal(t, before, readFile(t, ckPath), "checkpoint written on plugin disconnect")

			e.clock.Step(tc.want)
			c, a, removed := e.mgr.GetCapacity()
			assert.Empty(t, removed, "removed at exactly the grace period (must be strictly greater)")
			assert.Contains(t, c, v1.ResourceName(resGPU))
			assert.Contains(t, a, v1.ResourceName(resGPU))

			e.clock.Step(time.Nanosecond)
			c, a, removed = e.mgr.GetCapacity()
			assert.Equal(t, []string{resGPU}, removed)
			assert.NotContains(t, c, v1.ResourceName(resGPU))
			assert.NotContains(t, a, v1.ResourceName(resGPU))
			assert.Contains(t, c, v1.ResourceName(resNIC), "the live resource was removed too")

			_, _, removed = e.mgr.GetCapacity()
			assert.Empty(t, removed, "a removed resource is reported once")
			assert.NotContains(t, e.mgr.GetAllocatableDevices(), resGPU)

			require.Eventually(t, func() bool {
				_, reg, ok := tryReadCheckpoint(e.dir)
				_, has := reg[resGPU]
				return ok && !has && len(reg[resNIC]) == 1
			}, waitFor, tick, "checkpoint not rewritten after GetCapacity removed a resource")
		})
	}
}

// Re-registration within the grace period keeps the resource for good.
func TestReRegisterWithinGrace(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	p := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	p.stop()
	e.waitCapacity(t, resGPU, 2, 0)
	e.clock.Step(4 * time.Minute)
	e.plugin(t, "p2.sock", resGPU, nil, healthy("d0"), healthy("d1"), healthy("d2"))
	e.clock.Step(10 * time.Minute)
	_, _, removed := e.mgr.GetCapacity()
	assert.Empty(t, removed)
	e.waitCapacity(t, resGPU, 3, 3)
}

// ListAndWatch messages above the kubelet's limit of 4 MiB are accepted by
// default (64 MiB), for plugins with tens of thousands of devices.
func TestLargeDeviceListAccepted(t *testing.T) {
	if testing.Short() {
		t.Skip("large list")
	}
	e := newEnv(t, nil)
	e.start(t)
	const n = 70000
	devs := make([]*pluginapi.Device, 0, n)
	pad := strings.Repeat("x", 60)
	for i := range n {
		devs = append(devs, healthy(fmt.Sprintf("%s-%06d", pad, i)))
	}
	p := newFakePlugin(t, e.dir, "p.sock", resGPU, nil, devs...)
	p.start(t)
	require.NoError(t, registerPlugin(t, e.dir, p))
	// Under the race detector on a busy machine, applying and checkpointing
	// this many devices can outlast the usual waits.
	e.waitCapacityWithin(t, time.Minute, resGPU, n, n)
}

// A message that leaves the healthy set unchanged costs no checkpoint write
// (the kubelet writes after every message, and many plugins resend the same
// list every few seconds); one that changes it is written.
func TestCheckpointNotRewrittenForSameHealthySet(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	p := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"), healthy("d1"))
	q := e.plugin(t, "q.sock", resNIC, nil, healthy("n0"))
	ckPath := filepath.Join(e.dir, checkpoint.DeviceManagerKey)
	require.Eventually(t, func() bool {
		_, reg, ok := tryReadCheckpoint(e.dir)
		return ok && len(reg[resGPU]) == 2 && len(reg[resNIC]) == 1
	}, waitFor, tick)
	require.NoError(t, os.Remove(ckPath))

	// Same healthy set (plus an unhealthy device, which is not content).
	p.update(healthy("d1"), healthy("d0"), unhealthy("d9"))
	e.waitCapacity(t, resGPU, 3, 2)
	// A second unchanged-content message on the same stream: once it is
	// processed, any write caused by the first one has finished.
	p.update(healthy("d0"), unhealthy("d8"), healthy("d1"), unhealthy("d9"))
	e.waitCapacity(t, resGPU, 4, 2)
	_, err := os.Stat(ckPath)
	assert.True(t, os.IsNotExist(err), "checkpoint rewritten for a message that left its content unchanged")
	// A change on the other resource is written; that write must carry the
	// unchanged gpu set, and nothing in between may have written.
	q.update(healthy("n0"), healthy("n1"))
	e.waitCapacity(t, resNIC, 2, 2)
	require.Eventually(t, func() bool {
		_, err := os.Stat(ckPath)
		return err == nil
	}, waitFor, tick, "changed content not written")
	_, reg := readCheckpoint(t, e.dir)
	assert.Equal(t, []string{"d0", "d1"}, sortedCopy(reg[resGPU]))
	assert.Equal(t, []string{"n0", "n1"}, sortedCopy(reg[resNIC]))
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// A resource whose plugin lists no device stays listed, with zero, in
// GetCapacity and GetAllocatableDevices.
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

// Options.MaxRecvMsgSize bounds one ListAndWatch message.
func TestMaxRecvMsgSizeEndsOversizedStream(t *testing.T) {
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
