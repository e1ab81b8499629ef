package devicemanager

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/internal/pluginreg"
)

// watcherHandler is the plugin-registry path of registration, for plugins
// that register the way CSI and DRA drivers do instead of calling
// kubelet.sock: a watcher of the registry directory (package pluginwatcher;
// Start runs one when Options.PluginsRegistryDir is set) hands each
// "DevicePlugin" to it. Both paths work at the same time.
type watcherHandler struct{ m *ManagerImpl }

// GetWatcherHandler returns the handler a plugin-registry watcher calls for
// plugins of type DevicePlugin.
func (m *ManagerImpl) GetWatcherHandler() PluginHandler { return watcherHandler{m: m} }

// ValidatePlugin accepts a plugin that supports v1beta1 and whose name is a
// valid extended resource name.
func (h watcherHandler) ValidatePlugin(pluginName, _ string, versions []string) error {
	if !slices.ContainsFunc(versions, func(v string) bool { return slices.Contains(pluginreg.SupportedVersions, v) }) {
		return fmt.Errorf("manager version, %s, is not among plugin supported versions %v", pluginapi.Version, versions)
	}
	if err := pluginreg.CheckResourceName(pluginName); err != nil {
		return fmt.Errorf("invalid name of device plugin socket: %w", err)
	}
	return nil
}

// RegisterPlugin dials the plugin at endpointPath (an absolute socket path)
// and starts following its devices.
func (h watcherHandler) RegisterPlugin(pluginName, endpointPath string, _ []string, timeout *time.Duration) error {
	if !filepath.IsAbs(endpointPath) {
		return fmt.Errorf("invalid endpoint %q: the plugin registry path needs an absolute socket path", endpointPath)
	}
	ctx := h.m.ctx
	if timeout != nil && *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	return h.m.connect(ctx, pluginName, endpointPath)
}

// DeRegisterPlugin disconnects the plugin instance at endpointPath.
func (h watcherHandler) DeRegisterPlugin(pluginName, endpointPath string) {
	m := h.m
	m.mu.Lock()
	var in *instance
	if r := m.core.resources[pluginName]; r != nil {
		in = r.instances[endpointPath]
	}
	m.mu.Unlock()
	if in == nil {
		return
	}
	m.log.V(2).Info("Deregistering device plugin", keyResource, pluginName, keySocket, endpointPath)
	// Stopping ends the stream; follow then disconnects the instance.
	in.ep.Stop()
}
