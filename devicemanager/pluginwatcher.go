package devicemanager

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	regapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/openkubelet/devmgr/internal/pluginreg"
)

// The plugin watcher: the plugin-registry path of registration, for plugins
// that register the
// way CSI and DRA drivers do instead of calling kubelet.sock: a plugin puts a
// socket serving the pluginregistration v1 Registration service in the
// registry directory; the manager calls GetInfo, registers a "DevicePlugin"
// through GetWatcherHandler's handler, and tells the plugin the outcome with
// NotifyRegistrationStatus. A socket that disappears deregisters its plugin.
// Both paths work at the same time.

// getInfoTimeout bounds GetInfo and NotifyRegistrationStatus, as the
// kubelet's plugin watcher does.
const getInfoTimeout = time.Second

// registryEntry is a plugin registered through a registry socket.
type registryEntry struct {
	name, endpoint string
}

// watchRegistry starts the registry watcher: it handles the sockets already
// in the directory, then every socket created later. Expects Start's caller
// context; the goroutines it starts are counted in m.wg and end with m.ctx.
func (m *ManagerImpl) watchRegistry() error {
	dir := m.opts.PluginsRegistryDir
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("create plugins registry directory: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch plugins registry: %w", err)
	}
	if err := w.Add(dir); err != nil {
		_ = w.Close()
		return fmt.Errorf("watch plugins registry %s: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		_ = w.Close()
		return fmt.Errorf("list plugins registry: %w", err)
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer w.Close()
		for _, e := range entries {
			m.registrySocketAppeared(filepath.Join(dir, e.Name()))
		}
		for {
			select {
			case <-m.ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				switch {
				case ev.Has(fsnotify.Create):
					m.registrySocketAppeared(ev.Name)
				case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
					m.registrySocketGone(ev.Name)
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				m.log.Error(err, "Plugins registry watcher error", keyPath, dir)
			}
		}
	}()
	m.log.V(2).Info("Watching the plugins registry", keyPath, dir)
	return nil
}

// registrySocketAppeared registers the plugin behind a new registry socket,
// in a goroutine of its own so that a slow plugin delays no other.
func (m *ManagerImpl) registrySocketAppeared(path string) {
	if strings.HasPrefix(filepath.Base(path), ".") {
		return
	}
	if info, err := os.Lstat(path); err != nil || info.Mode().Type() != fs.ModeSocket {
		return
	}
	m.mu.Lock()
	if m.state != started {
		m.mu.Unlock()
		return
	}
	m.wg.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		if err := m.registerFromRegistry(path); err != nil {
			m.log.Error(err, "Failed to register device plugin from the plugins registry", keySocket, path)
		}
	}()
}

func (m *ManagerImpl) registerFromRegistry(path string) error {
	ctx, cancel := context.WithTimeout(m.ctx, m.opts.DialTimeout)
	defer cancel()
	conn, err := grpc.NewClient("passthrough:///localhost",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := regapi.NewRegistrationClient(conn)
	infoCtx, cancelInfo := context.WithTimeout(ctx, m.opts.DialTimeout)
	info, err := client.GetInfo(infoCtx, &regapi.InfoRequest{}, grpc.WaitForReady(true))
	cancelInfo()
	if err != nil {
		return fmt.Errorf("GetInfo: %w", err)
	}
	notify := func(regErr error) error {
		st := &regapi.RegistrationStatus{PluginRegistered: regErr == nil}
		if regErr != nil {
			st.Error = regErr.Error()
		}
		nctx, ncancel := context.WithTimeout(m.ctx, getInfoTimeout)
		defer ncancel()
		if _, err := client.NotifyRegistrationStatus(nctx, st); err != nil {
			return errors.Join(regErr, fmt.Errorf("NotifyRegistrationStatus: %w", err))
		}
		return regErr
	}
	if info.GetType() != regapi.DevicePlugin {
		m.log.V(2).Info("Ignoring a registry socket that is not a device plugin", keySocket, path, "type", info.GetType())
		return nil
	}
	endpointPath := info.GetEndpoint()
	if endpointPath == "" {
		endpointPath = path // the plugin serves both services on one socket
	}
	handler := m.GetWatcherHandler()
	if err := handler.ValidatePlugin(info.GetName(), endpointPath, info.GetSupportedVersions()); err != nil {
		return notify(err)
	}
	if err := handler.RegisterPlugin(info.GetName(), endpointPath, info.GetSupportedVersions(), nil); err != nil {
		return notify(err)
	}
	m.mu.Lock()
	if m.registry == nil {
		m.registry = map[string]registryEntry{}
	}
	m.registry[path] = registryEntry{name: info.GetName(), endpoint: endpointPath}
	m.mu.Unlock()
	m.log.V(2).Info("Registered device plugin from the plugins registry", keyResource, info.GetName(), keySocket, endpointPath, "registrySocket", path)
	return notify(nil)
}

// registrySocketGone deregisters the plugin of a registry socket that was
// removed.
func (m *ManagerImpl) registrySocketGone(path string) {
	m.mu.Lock()
	e, ok := m.registry[path]
	delete(m.registry, path)
	m.mu.Unlock()
	if ok {
		m.log.V(2).Info("Registry socket removed; deregistering its device plugin", keyResource, e.name, keySocket, path)
		m.GetWatcherHandler().DeRegisterPlugin(e.name, e.endpoint)
	}
}

// watcherHandler is the plugin-registry path of registration.
type watcherHandler struct{ m *ManagerImpl }

// GetWatcherHandler returns the handler a plugin-registry watcher calls for
// plugins of type DevicePlugin.
func (m *ManagerImpl) GetWatcherHandler() PluginHandler { return watcherHandler{m: m} }

func (h watcherHandler) ValidatePlugin(pluginName, _ string, versions []string) error {
	if !slices.ContainsFunc(versions, func(v string) bool { return slices.Contains(pluginreg.SupportedVersions, v) }) {
		return fmt.Errorf("manager version, %s, is not among plugin supported versions %v", pluginapi.Version, versions)
	}
	if err := pluginreg.CheckResourceName(pluginName); err != nil {
		return fmt.Errorf("invalid name of device plugin socket: %w", err)
	}
	return nil
}

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
