package devicemanager

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
)

// A plugin that comes back with the devices it had does not cause a write:
// the file holds that content already.
func TestReRegistrationWithSameListDoesNotRewrite(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("dev", 2))
	path := filepath.Join(h.dir, checkpoint.DeviceManagerKey)
	h.eventually(func() bool { _, err := os.Stat(path); return err == nil }, "written")
	first, err := os.Stat(path)
	require.NoError(t, err)
	p.CloseStreams()
	h.waitCapacity(res1, 2, 0)
	h.register(p)
	p.Update([]*pluginapi.Device{dev("dev0", healthy, 0), dev("dev1", healthy)}) // applied after the re-registration's write
	h.waitDeviceTopology(res1, "dev0", 0)
	again, err := os.Stat(path)
	require.NoError(t, err)
	assert.True(t, os.SameFile(first, again))
}

// After a failed write the file's content is unknown: the next write is not
// skipped even when it brings back the content of before.
func TestWriteAfterFailedWriteIsNotSkipped(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("dev", 2))
	h.eventually(func() bool { return slices.Equal(checkpointHealthy(h, res1), []string{"dev0", "dev1"}) }, "first write")
	s := h.faultyStore()
	s.set(true, true) // the file gets the new content, the store reports failure
	h.m.PluginListAndWatchReceiver(h.m.log, res1, &pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{dev("dev0", healthy), dev("dev1", sick)}})
	s.set(false, false)
	h.m.PluginListAndWatchReceiver(h.m.log, res1, &pluginapi.ListAndWatchResponse{Devices: devices("dev", 2)})
	assert.Equal(t, []string{"dev0", "dev1"}, checkpointHealthy(h, res1))
}

// checkpointHealthy returns the healthy IDs of res in the checkpoint file (nil if unreadable).
func checkpointHealthy(h *harness, res string) []string {
	store, err := checkpoint.NewManager(h.dir)
	require.NoError(h.t, err)
	data := checkpoint.New(nil, nil)
	if store.GetCheckpoint(checkpoint.DeviceManagerKey, data) != nil {
		return nil
	}
	_, registered := data.GetData()
	return registered[res]
}
