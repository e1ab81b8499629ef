package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/fsnotify/fsnotify"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/internal/pluginreg"
	"github.com/openkubelet/devmgr/plugintest"
)

// fakePluginOptions are the flags of "devmgr fake-plugin".
type fakePluginOptions struct {
	socketDir string
	resource  string
	devices   int
	numa      []int
	cdi       bool
	unhealthy []string
}

// maxFakeDevices bounds --devices: a ListAndWatch message of that many
// devices stays far below gRPC's default 4 MiB limit.
const maxFakeDevices = 10000

func newFakePluginCmd() *cobra.Command {
	o := &fakePluginOptions{}
	cmd := &cobra.Command{
		Use:   "fake-plugin --socket-dir DIR --resource NAME",
		Short: "Run a device plugin of fake devices, to try serve and sanity with",
		Long: `fake-plugin is a device plugin of fake devices, correct by the rules of
"devmgr sanity": something to run "devmgr serve" and "devmgr sanity" against
before your own plugin exists, or to compare it with.

It serves the device-plugin API on DIR/<resource with "/" as "-">.sock (for
example.com/gpu: DIR/example.com-gpu.sock) and registers on DIR/kubelet.sock,
waiting for that socket to appear if it is not there yet (it says so). As a
real plugin does, it registers again each time kubelet.sock is created anew
(a kubelet, serve or sanity restarting), serving its socket again first if
it was removed. It runs until SIGINT or SIGTERM, then removes its socket and
exits 0.

Its devices are named after the resource's name without its domain, numbered
from 0: --resource example.com/gpu --devices 3 lists gpu-0, gpu-1 and gpu-2.
--numa assigns them NUMA nodes round-robin (--numa 0,1: gpu-0 on node 0, gpu-1
on node 1, gpu-2 on node 0); without it they have no topology. --unhealthy
lists devices reported Unhealthy. Allocate answers device specs, mounts, an
environment variable and an annotation for the devices asked for (plus, with
--cdi, one CDI device each, named RESOURCE=ID: example.com/gpu=gpu-0), and
refuses a device the plugin never listed. It offers GetPreferredAllocation
and requires PreStartContainer, which it answers at once.

-v 2 (the default) logs its registrations; -v 4 every call it gets.

Exit codes: 0 stopped by a signal; 1 it could not serve (the directory cannot
be created, the socket cannot be listened on); 2 a bad flag.`,
		Example: `  # A fake kubelet, and a plugin of four GPUs on two NUMA nodes for it.
  devmgr serve --socket-dir /tmp/dp --control-socket /tmp/dp-ctl.sock --numa-nodes 0,1 &
  devmgr fake-plugin --socket-dir /tmp/dp --resource example.com/gpu --devices 4 --numa 0,1 &
  devmgr status --control-socket /tmp/dp-ctl.sock --wait-for example.com/gpu

  # The conformance suite, which passes every check it can run against it.
  devmgr sanity --socket-dir /tmp/dq --numa-nodes 0,1 &
  devmgr fake-plugin --socket-dir /tmp/dq --resource example.com/gpu --numa 0,1 --cdi`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runFakePlugin(cmd, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.socketDir, "socket-dir", "", "directory of kubelet.sock, where the plugin serves its socket (created if missing)")
	f.StringVar(&o.resource, "resource", "", "the extended resource the plugin serves, such as example.com/gpu")
	f.IntVar(&o.devices, "devices", 2, fmt.Sprintf("how many devices it lists, from 1 to %d", maxFakeDevices))
	f.IntSliceVar(&o.numa, "numa", nil, "NUMA node ids assigned to the devices round-robin, such as 0,1 (default: no topology)")
	f.BoolVar(&o.cdi, "cdi", false, "make Allocate name one CDI device per device, RESOURCE=ID")
	f.StringSliceVar(&o.unhealthy, "unhealthy", nil, "IDs of devices reported Unhealthy, such as gpu-1")
	for _, name := range []string{"socket-dir", "resource"} {
		if err := cmd.MarkFlagRequired(name); err != nil {
			panic(err) // a flag defined above
		}
	}
	return cmd
}

// fakePluginConfig is fakePluginOptions checked: the plugin's options and
// the kubelet socket it registers on.
type fakePluginConfig struct {
	plugin        plugintest.Options
	kubeletSocket string
}

// config checks the flags; each error names the flag to change.
func (o *fakePluginOptions) config() (fakePluginConfig, error) {
	var cfg fakePluginConfig
	dir, err := absDir("--socket-dir", o.socketDir)
	if err != nil {
		return cfg, err
	}
	cfg.kubeletSocket = filepath.Join(dir, devicemanager.KubeletSocketName)
	if err := pluginreg.CheckResourceName(o.resource); err != nil {
		return cfg, fmt.Errorf("--resource %q is not an extended resource name: domain/name, outside kubernetes.io (such as example.com/gpu)", o.resource)
	}
	if o.devices < 1 || o.devices > maxFakeDevices {
		return cfg, fmt.Errorf("--devices must be from 1 to %d, not %d", maxFakeDevices, o.devices)
	}
	for _, n := range o.numa {
		if n < 0 || n > 63 {
			return cfg, fmt.Errorf("--numa: node %d out of range 0-63", n)
		}
	}
	_, short, _ := strings.Cut(o.resource, "/")
	devices := make([]*pluginapi.Device, o.devices)
	ids := make([]string, o.devices)
	for i := range devices {
		ids[i] = short + "-" + strconv.Itoa(i)
		devices[i] = &pluginapi.Device{ID: ids[i], Health: pluginapi.Healthy}
		if len(o.numa) > 0 {
			devices[i].Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(o.numa[i%len(o.numa)])}}}
		}
	}
	for _, id := range o.unhealthy {
		i := slices.Index(ids, id)
		if i < 0 {
			return cfg, fmt.Errorf("--unhealthy: no device %q; the devices are %s", id, deviceRange(ids))
		}
		devices[i].Health = pluginapi.Unhealthy
	}
	cfg.plugin = plugintest.Options{
		ResourceName:                    o.resource,
		SocketDir:                       dir,
		Devices:                         devices,
		PreStartRequired:                true,
		GetPreferredAllocationAvailable: true,
	}
	if o.cdi {
		name := func(id string) string { return o.resource + "=" + id }
		if _, _, _, err := parser.ParseQualifiedName(name(ids[0])); err != nil {
			return cfg, fmt.Errorf("--cdi: %s does not make CDI device names (vendor/class=name): %w", o.resource, err)
		}
		cfg.plugin.CDIDeviceName = name
	}
	// plugintest checks the length of the socket path.
	p, err := plugintest.New(cfg.plugin)
	if err != nil {
		return cfg, fmt.Errorf("--socket-dir: %w", err)
	}
	p.Stop()
	if n := len(cfg.kubeletSocket); n > maxSocketPath {
		return cfg, fmt.Errorf("--socket-dir: %s is %d bytes long; a unix socket path holds at most %d", cfg.kubeletSocket, n, maxSocketPath)
	}
	return cfg, nil
}

// deviceRange names the devices for a message: "gpu-0 to gpu-3", or the one.
func deviceRange(ids []string) string {
	if len(ids) == 1 {
		return ids[0]
	}
	return ids[0] + " to " + ids[len(ids)-1]
}

// runFakePlugin runs "devmgr fake-plugin" until SIGINT or SIGTERM, or the
// command's context, ends it.
func runFakePlugin(cmd *cobra.Command, o *fakePluginOptions) error {
	// Its registrations show unless -v says otherwise.
	logger, err := newLogger("text", logVerbosity(cmd, 2), cmd.ErrOrStderr())
	if err != nil {
		return withExitCode(exitUsage, err)
	}
	cfg, err := o.config()
	if err != nil {
		return withExitCode(exitUsage, err)
	}
	cfg.plugin.Logger = logger
	ctx, stopSignals := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	dir := cfg.plugin.SocketDir
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("--socket-dir: %w", err)
	}
	// Watched before kubelet.sock is looked for, so that its creation in
	// between is seen.
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	var ids, unhealthy []string
	for _, d := range cfg.plugin.Devices {
		ids = append(ids, d.ID)
		if d.Health != pluginapi.Healthy {
			unhealthy = append(unhealthy, d.ID)
		}
	}
	logger.Info("Fake device plugin", "resourceName", cfg.plugin.ResourceName, "devices", deviceRange(ids),
		"unhealthy", unhealthy, "numaNodes", o.numa, "cdi", o.cdi)

	// A new Plugin for each attempt: a kubelet that starts removes the
	// sockets in the directory, the plugin's too, before it creates
	// kubelet.sock, so the plugin serves once kubelet.sock is there. Once
	// registered, the Plugin follows kubelet.sock by itself.
	var p *plugintest.Plugin
	for again := false; ; again = true {
		if err := waitForKubeletSocket(ctx, w, cfg.kubeletSocket, again, logger); err != nil {
			return stoppedBy(ctx, err)
		}
		if p, err = plugintest.New(cfg.plugin); err != nil {
			return err
		}
		if err := p.Start(); err != nil {
			return err
		}
		err := registerUnlessStopped(ctx, p, cfg.kubeletSocket)
		if err == nil {
			break
		}
		p.Stop()
		if ctx.Err() != nil {
			return stoppedBy(ctx, ctx.Err())
		}
		logger.Error(err, "Cannot register")
	}
	_ = w.Close() // the Plugin watches from now on
	<-ctx.Done()
	stopSignals() // a second signal ends the process at once
	logger.Info("Stopping")
	p.Stop()
	return stoppedBy(ctx, ctx.Err())
}

// stoppedBy returns nil when err comes from a signal, which ends the plugin
// as it should, and err otherwise.
func stoppedBy(ctx context.Context, err error) error {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil
	}
	return err
}

// waitForKubeletSocket returns once path exists or, with again (the last
// registration failed), once it is created anew; w watches its directory.
func waitForKubeletSocket(ctx context.Context, w *fsnotify.Watcher, path string, again bool, logger klog.Logger) error {
	if again {
		logger.Info("Waiting for the kubelet socket to be created anew", "path", path)
	} else if _, err := os.Lstat(path); err == nil {
		return nil
	} else {
		logger.Info("Waiting for the kubelet socket to appear", "path", path)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("the directory watch ended")
			}
			if ev.Has(fsnotify.Create) && filepath.Clean(ev.Name) == path {
				return nil
			}
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("the directory watch ended")
			}
			return fmt.Errorf("watch %s: %w", filepath.Dir(path), err)
		}
	}
}

// registerUnlessStopped registers p on kubeletSocket; a signal meanwhile
// stops p, which ends the registration.
func registerUnlessStopped(ctx context.Context, p *plugintest.Plugin, kubeletSocket string) error {
	registered := make(chan struct{})
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		select {
		case <-ctx.Done():
			p.Stop()
		case <-registered:
		}
	}()
	err := p.Register(kubeletSocket)
	close(registered)
	<-watcherDone
	return err
}
