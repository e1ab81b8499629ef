package kubeletcompat_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"

	"github.com/openkubelet/devmgr/plugintest"
)

// The kubelet's own plugin manager, watching a registry directory with the
// adapter's watcher handler for device plugins, registers a plugin that
// serves the pluginregistration service there: its devices count, and it is
// told it was registered. When its registry socket goes, the plugin manager
// deregisters it and its devices stop counting.
func TestKubeletPluginManagerDrivesTheWatcherHandler(t *testing.T) {
	dir, regDir := shortDir(t), shortDir(t)
	m, _ := adapterOn(t, dir, nil, nil)

	pm := pluginmanager.NewPluginManager(regDir, &record.FakeRecorder{})
	pm.AddHandler(registerapi.DevicePlugin, m.GetWatcherHandler())
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), testLogger(t)))
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		pm.Run(ctx, ready{}, stop)
	}()
	// Run returns on stop; the reconciler and watcher goroutines it starts
	// end with ctx and stop, and the plugin manager offers no wait for them.
	t.Cleanup(func() {
		close(stop)
		cancel()
		<-done
	})

	p, err := plugintest.New(plugintest.Options{ResourceName: gpu, SocketDir: dir, Devices: numaDevices([]int{0}, 2), Logger: testLogger(t)})
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	require.NoError(t, p.Start())
	require.NoError(t, p.ServeRegistry(regDir))
	waitAllocatable(t, m, 2)
	wctx, wcancel := context.WithTimeout(ctx, waitFor)
	defer wcancel()
	status, err := p.WaitForRegistrationStatus(wctx)
	require.NoError(t, err)
	assert.True(t, status.GetPluginRegistered(), "the plugin manager told the plugin: %q", status.GetError())

	p.StopRegistry()
	waitAllocatable(t, m, 0)
}
