package pluginwatcher_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	regapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/pluginwatcher"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// handler records the calls a watcher makes; refuse makes RegisterPlugin fail.
type handler struct {
	mu     sync.Mutex
	calls  []string
	refuse error
	// changed is signalled on every call.
	changed chan struct{}
}

func newHandler() *handler { return &handler{changed: make(chan struct{}, 100)} }

func (h *handler) record(call string) {
	h.mu.Lock()
	h.calls = append(h.calls, call)
	h.mu.Unlock()
	h.changed <- struct{}{}
}

func (h *handler) ValidatePlugin(name, _ string, _ []string) error {
	h.record("validate " + name)
	return nil
}

func (h *handler) RegisterPlugin(name, endpoint string, _ []string, _ *time.Duration) error {
	h.record("register " + name + " " + filepath.Base(endpoint))
	return h.refuse
}

func (h *handler) DeRegisterPlugin(name, endpoint string) {
	h.record("deregister " + name + " " + filepath.Base(endpoint))
}

// waitCalls waits until the handler has made n calls and returns them.
func (h *handler) waitCalls(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		h.mu.Lock()
		calls := append([]string(nil), h.calls...)
		h.mu.Unlock()
		if len(calls) >= n {
			return calls
		}
		select {
		case <-h.changed:
		case <-deadline:
			t.Fatalf("waiting for %d handler calls, got %q", n, calls)
		}
	}
}

func dirs(t *testing.T) (reg, plugins string) {
	dir, err := os.MkdirTemp("", "pw")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	reg, plugins = filepath.Join(dir, "reg"), filepath.Join(dir, "p")
	require.NoError(t, os.MkdirAll(plugins, 0o750))
	return reg, plugins
}

func plugin(t *testing.T, dir, resource string) *plugintest.Plugin {
	p, err := plugintest.New(plugintest.Options{ResourceName: resource, SocketDir: dir,
		Devices: []*pluginapi.Device{{ID: "d0", Health: pluginapi.Healthy}}})
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(p.Stop)
	return p
}

func status(t *testing.T, p *plugintest.Plugin) *regapi.RegistrationStatus {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := p.WaitForRegistrationStatus(ctx)
	require.NoError(t, err)
	return st
}

// A socket there before Start and one created later both reach the handler
// of their type, are told the outcome, and are deregistered when their
// socket goes.
func TestSocketsReachTheHandlerOfTheirType(t *testing.T) {
	reg, plugins := dirs(t)
	require.NoError(t, os.MkdirAll(reg, 0o750))
	early := plugin(t, plugins, "example.com/early")
	require.NoError(t, early.ServeRegistry(reg))

	h := newHandler()
	w, err := pluginwatcher.Start(pluginwatcher.Options{Dir: reg, Handlers: map[string]pluginwatcher.Handler{regapi.DevicePlugin: h}})
	require.NoError(t, err)
	defer w.Stop()
	assert.Equal(t, []string{"validate example.com/early", "register example.com/early example.com-early.sock"}, h.waitCalls(t, 2))
	assert.True(t, status(t, early).PluginRegistered)

	late := plugin(t, plugins, "example.com/late")
	require.NoError(t, late.ServeRegistry(reg))
	assert.True(t, status(t, late).PluginRegistered)
	late.StopRegistry()
	calls := h.waitCalls(t, 5)
	assert.Equal(t, "deregister example.com/late example.com-late.sock", calls[4])
}

// A refusal is reported to the plugin, and a socket of a type no handler
// takes is left alone.
func TestRefusalsAndOtherTypes(t *testing.T) {
	reg, plugins := dirs(t)
	h := newHandler()
	h.refuse = errors.New("no room")
	w, err := pluginwatcher.Start(pluginwatcher.Options{Dir: reg, Handlers: map[string]pluginwatcher.Handler{regapi.DevicePlugin: h}})
	require.NoError(t, err)
	defer w.Stop()

	csi := plugin(t, plugins, "example.com/csi")
	info := csi.PluginInfo()
	info.Type = regapi.CSIPlugin
	csi.SetPluginInfo(info)
	require.NoError(t, csi.ServeRegistry(reg))
	refused := plugin(t, plugins, "example.com/refused")
	require.NoError(t, refused.ServeRegistry(reg))

	st := status(t, refused)
	assert.False(t, st.PluginRegistered)
	assert.Equal(t, "no room", st.Error)
	require.Eventually(t, func() bool { return len(csi.CallsOf(plugintest.MethodGetInfo)) == 1 }, 10*time.Second, 10*time.Millisecond)
	w.Stop()
	assert.Equal(t, []string{"validate example.com/refused", "register example.com/refused example.com-refused.sock"}, h.waitCalls(t, 2),
		"nothing for the CSI plugin")
	assert.Empty(t, csi.CallsOf(plugintest.MethodNotifyRegistrationStatus), "a plugin of another type is not told anything")
}

func TestDirMustBeAbsolute(t *testing.T) {
	_, err := pluginwatcher.Start(pluginwatcher.Options{Dir: "reg"})
	assert.ErrorContains(t, err, "absolute")
}
