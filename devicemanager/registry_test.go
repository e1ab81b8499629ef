package devicemanager

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	regapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/openkubelet/devmgr/plugintest"
)

func registryStatus(t *testing.T, p *plugintest.Plugin) *regapi.RegistrationStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	st, err := p.WaitForRegistrationStatus(ctx)
	require.NoError(t, err)
	return st
}

// A plugin registers through the plugins registry directory, is told so,
// is allocated, and is deregistered when its registry socket goes; a plugin
// using kubelet.sock works at the same time.
func TestPluginsRegistry(t *testing.T) {
	var regDir string
	h := newHarness(t, func(o *Options) { regDir = filepath.Join(o.SocketDir, "reg"); o.PluginsRegistryDir = regDir })
	// A plugin whose registry socket is there before the manager starts. Its
	// device plugin socket lives in a directory of its own (as registry
	// plugins do): Start removes stale sockets from the manager's SocketDir.
	pluginDir := filepath.Join(h.dir, "plugins")
	require.NoError(t, os.MkdirAll(pluginDir, 0o750))
	early := h.plugin(res2, devices("e", 1), func(o *plugintest.Options) { o.Endpoint = "early.sock"; o.SocketDir = pluginDir })
	require.NoError(t, os.MkdirAll(regDir, 0o750))
	require.NoError(t, early.ServeRegistry(regDir))
	h.start()
	h.waitCapacity(res2, 1, 1)
	assert.True(t, registryStatus(t, early).PluginRegistered)

	p := h.plugin(res1, devices("r", 2), func(o *plugintest.Options) { o.Endpoint = "r.sock" })
	require.NoError(t, p.ServeRegistry(regDir))
	h.waitCapacity(res1, 2, 2)
	st := registryStatus(t, p)
	assert.True(t, st.PluginRegistered)
	assert.Empty(t, st.Error)
	assert.Len(t, p.CallsOf(plugintest.MethodGetInfo), 1)

	direct := h.registered("example.com/direct", devices("d", 1), func(o *plugintest.Options) { o.Endpoint = "d.sock" })
	pod := newPod("p", ctr("app", res1, 1, "example.com/direct", 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	assert.Len(t, p.CallsOf(plugintest.MethodAllocate), 1)
	assert.Len(t, direct.CallsOf(plugintest.MethodAllocate), 1)

	p.StopRegistry() // the registry socket disappears
	h.waitCapacity(res1, 2, 0)
	c, a := h.capacity("example.com/direct")
	assert.Equal(t, []int64{1, 1}, []int64{c, a}, "the other path is unaffected")
}

// A registry plugin the manager refuses is told why.
func TestPluginsRegistryRefusal(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.PluginsRegistryDir = filepath.Join(o.SocketDir, "reg") })
	h.start()
	regDir := h.opts.PluginsRegistryDir

	bad := h.plugin("not-a-resource-name", nil, func(o *plugintest.Options) { o.Endpoint = "bad.sock" })
	require.NoError(t, bad.ServeRegistry(regDir))
	st := registryStatus(t, bad)
	assert.False(t, st.PluginRegistered)
	assert.Contains(t, st.Error, `the ResourceName "not-a-resource-name" is invalid`)

	old := h.plugin(res1, nil, func(o *plugintest.Options) { o.Endpoint = "old.sock" })
	info := old.PluginInfo()
	info.SupportedVersions = []string{"v1alpha1"}
	old.SetPluginInfo(info)
	require.NoError(t, old.ServeRegistry(regDir))
	st = registryStatus(t, old)
	assert.False(t, st.PluginRegistered)
	assert.Contains(t, st.Error, "is not among plugin supported versions")

	// Another kind of plugin (a CSI driver) is none of our business.
	csi := h.plugin(res2, nil, func(o *plugintest.Options) { o.Endpoint = "csi.sock" })
	info = csi.PluginInfo()
	info.Type = regapi.CSIPlugin
	csi.SetPluginInfo(info)
	require.NoError(t, csi.ServeRegistry(regDir))
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	_, err := csi.WaitForCalls(ctx, plugintest.MethodGetInfo, 1)
	require.NoError(t, err)
	c, _ := h.capacity(res2)
	assert.Equal(t, int64(-1), c)

	// The manager still serves a good plugin.
	good := h.plugin(res1, devices("g", 1), func(o *plugintest.Options) { o.Endpoint = "good.sock" })
	require.NoError(t, good.ServeRegistry(regDir))
	h.waitCapacity(res1, 1, 1)
}

func TestPluginsRegistryDirMustBeAbsolute(t *testing.T) {
	_, err := NewManagerImpl(Options{SocketDir: t.TempDir(), PluginsRegistryDir: "reg"})
	assert.Error(t, err)
}

// RegisterPlugin with a zero timeout registers (no deadline), as the kubelet
// ignores it.
func TestRegisterPluginZeroTimeout(t *testing.T) {
	h := newHarness(t).start()
	p := h.plugin(res1, devices("dev", 1))
	zero := time.Duration(0)
	require.NoError(t, h.m.GetWatcherHandler().RegisterPlugin(res1, p.SocketPath(), []string{pluginapi.Version}, &zero))
	h.waitCapacity(res1, 1, 1)
}
