// Package pluginwatcher is the kubelet's plugin watcher for a plugins
// registry directory (the kubelet's /var/lib/kubelet/plugins_registry):
// plugins that register the way CSI and DRA drivers do put a socket serving
// the pluginregistration v1 Registration service there. For each socket the
// watcher calls GetInfo, hands the plugin to the Handler of its type
// (validate, then register), and tells the plugin the outcome with
// NotifyRegistrationStatus. A socket that disappears deregisters its plugin.
//
// A devicemanager.ManagerImpl started with Options.PluginsRegistryDir runs
// one, with its GetWatcherHandler as the handler of device plugins.
//
// # Concurrency and lifecycle
//
// Start lists the sockets already in the directory and watches for new
// ones; each registration runs in a goroutine of its own, so a slow plugin
// delays no other. Stop ends the watch and waits for every goroutine the
// watcher started. The handlers are called from those goroutines.
package pluginwatcher

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/openkubelet/devmgr/internal/unixsock"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	regapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Handler takes the plugins of one type, as the kubelet's plugin handlers do.
type Handler interface {
	ValidatePlugin(pluginName, endpoint string, versions []string) error
	RegisterPlugin(pluginName, endpoint string, versions []string, timeout *time.Duration) error
	DeRegisterPlugin(pluginName, endpoint string)
}

// Options configure a Watcher.
type Options struct {
	// Dir is the registry directory (absolute); created (0750) if missing.
	Dir string
	// Handlers take the plugins by type (regapi.DevicePlugin, ...); sockets
	// of other types are ignored.
	Handlers map[string]Handler
	// CallTimeout bounds reaching a plugin and its GetInfo; default 10s.
	CallTimeout time.Duration
	// Logger is the watcher's logger; default klog.Background().
	Logger klog.Logger
}

// notifyTimeout bounds NotifyRegistrationStatus, as in the kubelet.
const notifyTimeout = time.Second

// Watcher watches one registry directory.
type Watcher struct {
	opts   Options
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu sync.Mutex
	// registered maps each registry socket to the plugin it registered.
	registered map[string]plugin
}

// plugin is a plugin registered through a registry socket.
type plugin struct {
	typ, name, endpoint string
}

// Start starts watching opts.Dir: the sockets already there are handled
// first, then every socket created later.
func Start(opts Options) (*Watcher, error) {
	if !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("plugins registry directory must be an absolute path: %q", opts.Dir)
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 10 * time.Second
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = klog.Background()
	}
	if err := os.MkdirAll(opts.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("create plugins registry directory: %w", err)
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch plugins registry: %w", err)
	}
	if err := fsw.Add(opts.Dir); err != nil {
		_ = fsw.Close()
		return nil, fmt.Errorf("watch plugins registry %s: %w", opts.Dir, err)
	}
	entries, err := os.ReadDir(opts.Dir)
	if err != nil {
		_ = fsw.Close()
		return nil, fmt.Errorf("list plugins registry: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watcher{opts: opts, ctx: ctx, cancel: cancel, registered: map[string]plugin{}}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer fsw.Close()
		for _, e := range entries {
			w.appeared(filepath.Join(opts.Dir, e.Name()))
		}
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-fsw.Events:
				if !ok {
					return
				}
				switch {
				case ev.Has(fsnotify.Create):
					w.appeared(ev.Name)
				case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
					w.gone(ev.Name)
				}
			case err, ok := <-fsw.Errors:
				if !ok {
					return
				}
				opts.Logger.Error(err, "Plugins registry watcher error", "path", opts.Dir)
			}
		}
	}()
	opts.Logger.V(2).Info("Watching the plugins registry", "path", opts.Dir)
	return w, nil
}

// Stop ends the watch and returns when every goroutine of the watcher has
// ended. It deregisters nothing. Idempotent.
func (w *Watcher) Stop() {
	w.cancel()
	w.wg.Wait()
}

// appeared registers the plugin behind a new socket, in a goroutine of its
// own. Names starting with "." and files that are not sockets are skipped.
func (w *Watcher) appeared(path string) {
	if strings.HasPrefix(filepath.Base(path), ".") {
		return
	}
	if info, err := os.Lstat(path); err != nil || info.Mode().Type() != fs.ModeSocket {
		return
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		if err := w.register(path); err != nil {
			w.opts.Logger.Error(err, "Failed to register a plugin from the plugins registry", "socket", path)
		}
	}()
}

func (w *Watcher) register(path string) error {
	ctx, cancel := context.WithTimeout(w.ctx, w.opts.CallTimeout)
	defer cancel()
	conn, err := unixsock.NewClient(path)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := regapi.NewRegistrationClient(conn)
	info, err := client.GetInfo(ctx, &regapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("GetInfo: %w", err)
	}
	handler := w.opts.Handlers[info.GetType()]
	if handler == nil {
		w.opts.Logger.V(2).Info("Ignoring a registry socket of a plugin type nothing handles", "socket", path, "type", info.GetType())
		return nil
	}
	notify := func(regErr error) error {
		st := &regapi.RegistrationStatus{PluginRegistered: regErr == nil}
		if regErr != nil {
			st.Error = regErr.Error()
		}
		nctx, ncancel := context.WithTimeout(w.ctx, notifyTimeout)
		defer ncancel()
		if _, err := client.NotifyRegistrationStatus(nctx, st); err != nil {
			return errors.Join(regErr, fmt.Errorf("NotifyRegistrationStatus: %w", err))
		}
		return regErr
	}
	endpoint := info.GetEndpoint()
	if endpoint == "" {
		endpoint = path // the plugin serves both services on one socket
	}
	if err := handler.ValidatePlugin(info.GetName(), endpoint, info.GetSupportedVersions()); err != nil {
		return notify(err)
	}
	if err := handler.RegisterPlugin(info.GetName(), endpoint, info.GetSupportedVersions(), nil); err != nil {
		return notify(err)
	}
	w.mu.Lock()
	w.registered[path] = plugin{typ: info.GetType(), name: info.GetName(), endpoint: endpoint}
	w.mu.Unlock()
	w.opts.Logger.V(2).Info("Registered a plugin from the plugins registry", "type", info.GetType(), "name", info.GetName(),
		"endpoint", endpoint, "socket", path)
	return notify(nil)
}

// gone deregisters the plugin of a socket that was removed.
func (w *Watcher) gone(path string) {
	w.mu.Lock()
	p, ok := w.registered[path]
	delete(w.registered, path)
	w.mu.Unlock()
	if ok {
		w.opts.Logger.V(2).Info("Registry socket removed; deregistering its plugin", "type", p.typ, "name", p.name, "socket", path)
		w.opts.Handlers[p.typ].DeRegisterPlugin(p.name, p.endpoint)
	}
}
