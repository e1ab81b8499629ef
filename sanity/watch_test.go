package sanity

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
)

// A plugin that floods ListAndWatch costs the suite at most maxLists lists:
// it stops reading, and says why.
func TestWatchStopsReadingAFlood(t *testing.T) {
	dir, err := os.MkdirTemp("", "sw")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	p, err := plugintest.New(plugintest.Options{ResourceName: "example.com/gpu", SocketDir: dir,
		Devices: []*pluginapi.Device{{ID: "gpu-0", Health: pluginapi.Healthy}}})
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	require.NoError(t, p.Start())
	conn, options, err := dialPlugin(t.Context(), filepath.Join(dir, "example.com-gpu.sock"), 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	require.NotNil(t, options)

	w := newWatch(&registration{conn: conn})
	t.Cleanup(w.stop)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = w.wait(ctx, func(m []*pluginapi.ListAndWatchResponse) bool { return len(m) > 0 })
	require.NoError(t, err)
	for range maxLists + 10 {
		p.Update(p.Devices())
	}
	msgs, err := w.wait(ctx, func([]*pluginapi.ListAndWatchResponse) bool { return false })
	require.ErrorContains(t, err, "the plugin sent more than 1000 lists: the suite stopped reading")
	assert.Len(t, msgs, maxLists)
}
