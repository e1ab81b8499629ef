package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/openkubelet/devmgr/internal/leakwait"
	"github.com/openkubelet/devmgr/testdata/demo"
)

// leakLimit is how long the demo's goroutines have to end once it returned.
const leakLimit = 10 * time.Second

// The demo in process: what it reports, and that it stops every goroutine
// it started and removes its directory.
func TestRunDemo(t *testing.T) {
	defer leakwait.VerifyNone(t, leakLimit, goleak.IgnoreCurrent())
	tmp := emptyTempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	rep, err := runDemo(ctx, demoConfig{pods: demo.Pods, logger: logr.Discard(), tempDir: tmp})
	require.NoError(t, err)
	_, statErr := os.Stat(rep.Dir)
	assert.ErrorIs(t, statErr, os.ErrNotExist, "the demo directory is removed")

	t.Run("plugins and capacity", func(t *testing.T) {
		assert.Equal(t, []demoPlugin{
			{Resource: demoGPU, Socket: "example.com-gpu.sock", Devices: 4, GetPreferredAllocationAvailable: true,
				PreferredAllocationPolicy: "pack on one NUMA node", CDI: true},
			{Resource: demoNIC, Socket: "example.com-nic.sock", Devices: 8, PreStartRequired: true, PreStartCalls: 3},
		}, rep.Plugins)
		require.Len(t, rep.Capacity, 2)
		for _, r := range rep.Capacity {
			assert.Equal(t, r.Capacity, r.Allocatable, r.Name)
			assert.Equal(t, r.Capacity, r.Free, r.Name)
			assert.False(t, r.RestoredFromCheckpoint)
		}
		assert.Equal(t, demoDevice{ID: "gpu-1", NUMANodes: []int64{1}, Health: "Healthy"}, rep.Capacity[0].Devices[1])
	})

	t.Run("admission", func(t *testing.T) {
		require.Len(t, rep.Pods, 3)
		training, inference, batch := rep.Pods[0], rep.Pods[1], rep.Pods[2]
		assert.True(t, training.Admitted)
		assert.True(t, inference.Admitted)
		assert.False(t, batch.Admitted)
		assert.Equal(t, `container "worker": requested number of devices unavailable for example.com/gpu. Requested: 2, Available: 1`, batch.Error)
		assert.Empty(t, batch.Containers)

		got := map[string]map[string][]string{}
		for _, p := range rep.Pods {
			for _, c := range p.Containers {
				got[p.Name+"/"+c.Name] = c.Devices
			}
		}
		assert.Equal(t, map[string]map[string][]string{
			"training/warmup":    {demoGPU: {"gpu-0"}},
			"training/net-agent": {demoNIC: {"nic-0"}},
			// gpu-0 comes back from the init container; gpu-2 is on its NUMA
			// node (the plugin's policy), where gpu-1 would not be.
			"training/trainer": {demoGPU: {"gpu-0", "gpu-2"}, demoNIC: {"nic-1", "nic-2"}},
			"inference/server": {demoGPU: {"gpu-1"}, demoNIC: {"nic-3"}},
		}, got)

		trainer := training.Containers[2]
		assert.Equal(t, demoKindApp, trainer.Kind)
		require.NotNil(t, trainer.RunOptions)
		assert.Equal(t, []string{"example.com/gpu=gpu-0", "example.com/gpu=gpu-2"}, trainer.RunOptions.CDIDevices)
		assert.Equal(t, []demoNameValue{
			{Name: "PLUGINTEST_EXAMPLE_COM_GPU", Value: "gpu-0,gpu-2"},
			{Name: "PLUGINTEST_EXAMPLE_COM_NIC", Value: "nic-1,nic-2"},
		}, trainer.RunOptions.Envs)
		assert.Len(t, trainer.RunOptions.Devices, 4)
		assert.Len(t, trainer.RunOptions.Mounts, 4)
	})

	t.Run("health", func(t *testing.T) {
		h := rep.Health
		require.NotNil(t, h)
		assert.Equal(t, "gpu-2", h.Device)
		assert.Equal(t, []string{"training"}, h.NotifiedPods)
		assert.Equal(t, []string{"7b0e5a52-0000-4000-8000-000000000001"}, h.NotifiedPodUIDs)
		assert.Equal(t, []demoDeviceHealth{
			{Pod: "training", Container: "trainer", Resource: demoGPU, Device: "gpu-0", Health: "Healthy"},
			{Pod: "training", Container: "trainer", Resource: demoGPU, Device: "gpu-2", Health: "Unhealthy"},
			{Pod: "training", Container: "trainer", Resource: demoNIC, Device: "nic-1", Health: "Healthy"},
			{Pod: "training", Container: "trainer", Resource: demoNIC, Device: "nic-2", Health: "Healthy"},
		}, h.Containers)
		assert.Equal(t, 3, h.Capacity[0].Allocatable)
	})

	t.Run("restart", func(t *testing.T) {
		r := rep.Restart
		require.NotNil(t, r)
		assert.Equal(t, demoCheckpointInfo{
			File: rep.Dir + "/kubelet_internal_checkpoint", Format: checkpointFormatCurrent,
			Checksum: r.Checkpoint.Checksum, ChecksumOK: true, Entries: 6,
		}, r.Checkpoint)
		assert.True(t, r.PluginSocketsRemoved)
		assert.Equal(t, 6, r.RestoredBeforePlugins)
		for _, c := range r.CapacityBeforePlugins {
			assert.True(t, c.RestoredFromCheckpoint, c.Name)
			assert.Zero(t, c.Allocatable, c.Name)
		}
		assert.True(t, r.PluginsRegistered)
		assert.Len(t, r.Allocations, 6)
		for _, a := range r.Allocations {
			assert.True(t, a.Same, "%+v", a)
			assert.NotEmpty(t, a.Before)
		}
		assert.True(t, r.RunOptionsSame)
		assert.True(t, r.AllSame)
	})

	t.Run("text", func(t *testing.T) {
		var out bytes.Buffer
		writeDemoText(&out, rep)
		for i, step := range demoSteps {
			assert.Contains(t, out.String(), "== "+string(rune('1'+i))+". "+step+"\n")
		}
		assert.Contains(t, out.String(), "Cleanup:    managers and plugins stopped, directory removed")
	})
}

// Whatever step fails, the demo stops what it started and removes its
// directory.
func TestRunDemoCleansUpOnError(t *testing.T) {
	defer leakwait.VerifyNone(t, leakLimit, goleak.IgnoreCurrent())
	for _, tc := range []struct {
		name    string
		tempDir func(t *testing.T) string
		ctx     func() (context.Context, context.CancelFunc)
		want    string
	}{
		{
			name:    "context ended: the plugins cannot register",
			tempDir: emptyTempDir,
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			},
			want: "context canceled",
		},
		{
			name: "socket path too long: the manager does not start",
			tempDir: func(t *testing.T) string {
				dir := emptyTempDir(t) + "/" + strings.Repeat("d", 100)
				require.NoError(t, os.Mkdir(dir, 0o700))
				t.Cleanup(func() { assert.NoError(t, os.Remove(dir), "the directory is empty") })
				return dir
			},
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 20*time.Second)
			},
			want: "too long",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			rep, err := runDemo(ctx, demoConfig{pods: demo.Pods, logger: logr.Discard(), tempDir: tc.tempDir(t)})
			require.ErrorContains(t, err, tc.want)
			require.NotNil(t, rep)
			assert.True(t, rep.Summary.CleanedUp)
			_, statErr := os.Stat(rep.Dir)
			assert.ErrorIs(t, statErr, os.ErrNotExist)
		})
	}
}
