package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/topology"
)

// serveOptions are the flags of "devmgr serve".
type serveOptions struct {
	socketDir       string
	checkpointDir   string
	controlSocket   string
	numaNodes       []int
	logFormat       string
	verbosity       int
	requirePlugin   []string
	stopGracePeriod time.Duration
	pluginWait      time.Duration
	sendPodInfo     bool
	extraOptions
	nodeOptions
}

func newServeCmd() *cobra.Command {
	o := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve --socket-dir DIR --control-socket PATH",
		Short: "Run a standalone device manager: a fake kubelet for device plugins",
		Long: `serve runs the kubelet's Device Manager on its own, as the kubelet does:
device plugins register on DIR/kubelet.sock, the manager follows their devices,
and every allocation is kept in DIR/kubelet_internal_checkpoint (a file the
kubelet itself can read).

serve refuses a socket directory in use, touching nothing there: one whose
kubelet.sock accepts connections (a running kubelet) or that another serve
holds. Otherwise, at start, unix sockets left in the socket directory are
removed, so plugins of an earlier run notice and register again; a stale
control socket is removed too. Allocations survive a restart on the same directories: the
checkpoint keeps the devices and .devmgr-serve-pods.json, next to it, keeps
the admitted pods.

With --kubeconfig, serve also publishes the device resources in the status
of Node --node-name (capacity and allocatable, as a kubelet does, here by
server-side apply), so that the scheduler places pods asking for them: the device
side of a node that has no kubelet. --register-node creates the Node if
missing. Other fields of the node's status are left to their writers.
--kubeconfig defaults to $KUBECONFIG: started where $KUBECONFIG is set, serve
publishes to that cluster; --kubeconfig= publishes nothing. --node-name
defaults to the host name, lower-cased, as the kubelet's.

serve logs every registration, device update and capacity change, and runs
until SIGINT or SIGTERM; then it removes its own sockets (never the plugins')
and exits 0.

Pods are admitted and released through the control socket, which speaks JSON
over HTTP: see "devmgr admit", "devmgr release", "devmgr pods" and
"devmgr status", or curl --unix-socket PATH http://devmgr/v1/status. Only the
user running serve can use the control socket (mode 0600).`,
		Example: `  # A fake kubelet in /tmp/dp: point your plugin at /tmp/dp/kubelet.sock.
  devmgr serve --socket-dir /tmp/dp --control-socket /tmp/dp-ctl.sock

  # Two NUMA nodes, JSON logs with the manager's registration details.
  devmgr serve --socket-dir /tmp/dp --control-socket /tmp/dp-ctl.sock \
      --numa-nodes 0,1 --log-format json -v 2

  # The device side of node edge-1: its devices in the Node's status.
  devmgr serve --socket-dir /tmp/dp --control-socket /tmp/dp-ctl.sock \
      --kubeconfig edge-1.kubeconfig --node-name edge-1 --register-node

  # Then, in another shell:
  devmgr admit --control-socket /tmp/dp-ctl.sock -f pod.yaml
  devmgr status --control-socket /tmp/dp-ctl.sock`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("control-socket") {
				o.controlSocket = os.Getenv(envControlSocket)
			}
			o.fromEnvironment(cmd.Flags(), os.Getenv) // --kubeconfig from $KUBECONFIG
			o.draFlagsSet = slices.ContainsFunc(draFlags, cmd.Flags().Changed)
			o.verbosity = logVerbosity(cmd, 0)
			return runServe(cmd.Context(), o, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.socketDir, "socket-dir", "", "directory of kubelet.sock and the plugins' sockets (created if missing)")
	f.StringVar(&o.checkpointDir, "checkpoint-dir", "", "directory of kubelet_internal_checkpoint and the admitted pods (default: the socket directory)")
	f.StringVar(&o.controlSocket, "control-socket", "", "path of the unix socket of the control API (admit, release, pods, status) (default: $"+envControlSocket+")")
	f.IntSliceVar(&o.numaNodes, "numa-nodes", nil, "the machine's NUMA node ids, such as 0,1 (default: read from /sys/devices/system/node; none there means node 0)")
	f.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	f.StringSliceVar(&o.requirePlugin, "require-plugin", nil, "resource names, or domain/*, that only a device plugin serves: admission fails while no plugin registered them (default: such resources are ignored, as by the kubelet)")
	f.DurationVar(&o.stopGracePeriod, "stop-grace-period", devicemanager.DefaultStopGracePeriod, "how long a resource stays known after its plugin is gone")
	f.DurationVar(&o.pluginWait, "plugin-wait", 0, "how long an admission waits for a resource's plugin that is known but not ready (after a restart, until it registers again and lists its devices) before it is refused with 503 PluginNotReady; keep it below the clients' --timeout (default: refuse at once)")
	f.BoolVar(&o.sendPodInfo, "send-pod-info", false, "name the pod and container of each Allocate, GetPreferredAllocation and PreStartContainer call in its gRPC metadata (keys devmgr-namespace, devmgr-name, devmgr-uid, devmgr-container; the kubelet sends none)")
	o.extraOptions.addFlags(f)
	o.nodeOptions.addFlags(f)
	if err := errors.Join(cmd.MarkFlagRequired("socket-dir"), o.addCompletions(cmd),
		cmd.RegisterFlagCompletionFunc("log-format", cobra.FixedCompletions([]string{"text", "json"}, cobra.ShellCompDirectiveNoFileComp))); err != nil {
		panic(err) // flags defined above
	}
	return cmd
}

// serveConfig is serveOptions checked and completed.
type serveConfig struct {
	socketDir       string
	checkpointDir   string
	controlSocket   string
	numaNodes       []int
	requirePlugin   []string
	stopGracePeriod time.Duration
	pluginWait      time.Duration
	sendPodInfo     bool
	extraConfig
	nodeConfig
}

// config checks the options and fills in defaults: absolute paths, the
// checkpoint directory, and the NUMA nodes read from sysRoot when none are
// given.
func (o *serveOptions) config(sysRoot string) (serveConfig, error) {
	var cfg serveConfig
	var err error
	if cfg.socketDir, err = absDir("--socket-dir", o.socketDir); err != nil {
		return cfg, err
	}
	ck := o.checkpointDir
	if ck == "" {
		ck = cfg.socketDir
	}
	if cfg.checkpointDir, err = absDir("--checkpoint-dir", ck); err != nil {
		return cfg, err
	}
	if o.controlSocket == "" {
		return cfg, errors.New("no control socket: set --control-socket or $" + envControlSocket)
	}
	if cfg.controlSocket, err = filepath.Abs(o.controlSocket); err != nil {
		return cfg, fmt.Errorf("--control-socket: %w", err)
	}
	if n := len(cfg.controlSocket); n > maxSocketPath {
		return cfg, fmt.Errorf("--control-socket %s is %d bytes long; a unix socket path holds at most %d", cfg.controlSocket, n, maxSocketPath)
	}
	if cfg.controlSocket == filepath.Join(cfg.socketDir, devicemanager.KubeletSocketName) {
		return cfg, fmt.Errorf("--control-socket %s is the registration socket; choose another path", cfg.controlSocket)
	}
	cfg.numaNodes = slices.Clone(o.numaNodes)
	if len(cfg.numaNodes) == 0 {
		if cfg.numaNodes, err = topology.Discover(sysRoot); err != nil {
			return cfg, &exitError{code: exitFailure, err: fmt.Errorf("discover NUMA nodes (set --numa-nodes to skip): %w", err)}
		}
	}
	slices.Sort(cfg.numaNodes)
	cfg.numaNodes = slices.Compact(cfg.numaNodes)
	if o.stopGracePeriod <= 0 {
		return cfg, fmt.Errorf("--stop-grace-period must be positive, not %s", o.stopGracePeriod)
	}
	cfg.stopGracePeriod = o.stopGracePeriod
	if o.pluginWait < 0 {
		return cfg, fmt.Errorf("--plugin-wait must not be negative, not %s", o.pluginWait)
	}
	cfg.pluginWait = o.pluginWait
	cfg.requirePlugin = o.requirePlugin
	cfg.sendPodInfo = o.sendPodInfo
	if cfg.extraConfig, err = o.extraOptions.config(cfg); err != nil {
		return cfg, err
	}
	if cfg.nodeConfig, err = o.nodeOptions.config(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// maxSocketPath is the longest unix socket path Linux accepts.
const maxSocketPath = 107

// absDir returns dir made absolute; dir may be missing but must not be
// anything other than a directory.
func absDir(flag, dir string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("%s must not be empty", flag)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", &exitError{code: exitFailure, err: fmt.Errorf("%s: %w", flag, err)}
	}
	fi, err := os.Stat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return abs, nil
	case err != nil: // say a directory on the way that cannot be searched
		return "", &exitError{code: exitFailure, err: fmt.Errorf("%s: %w", flag, err)}
	case !fi.IsDir():
		return "", fmt.Errorf("%s %s is not a directory", flag, abs)
	}
	return abs, nil
}

// newLogger returns the logger of "devmgr serve": klog's text format or one
// JSON object a line, at verbosity v, written to w.
func newLogger(format string, v int, w io.Writer) (klog.Logger, error) {
	if v < 0 {
		return klog.Logger{}, fmt.Errorf("-v must not be negative, not %d", v)
	}
	switch format {
	case "text":
		return textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(v), textlogger.Output(w))), nil
	case "json":
		var mu sync.Mutex // one whole line per write
		return funcr.NewJSON(func(obj string) {
			mu.Lock()
			defer mu.Unlock()
			_, _ = fmt.Fprintln(w, obj)
		}, funcr.Options{LogTimestamp: true, TimestampFormat: time.RFC3339Nano, Verbosity: v}), nil
	}
	return klog.Logger{}, fmt.Errorf("--log-format must be text or json, not %q", format)
}

// runServe runs "devmgr serve" until ctx ends or SIGINT or SIGTERM arrives.
func runServe(ctx context.Context, o *serveOptions, logOut io.Writer) error {
	logger, err := newLogger(o.logFormat, o.verbosity, logOut)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	// Code that logs through klog's global functions logs here too.
	klog.SetLogger(logger)
	// config checks the flags: each of its errors names the flag to change,
	// and is a usage error unless the machine failed it (exitFailure).
	cfg, err := o.config("/")
	if err != nil {
		return withExitCode(exitUsage, err)
	}
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()

	s, err := startServer(cfg, logger)
	if err != nil {
		return err
	}
	var failure error
	select {
	case <-ctx.Done():
		// A second signal now ends the process at once.
		stopSignals()
		logger.Info("Shutting down")
	case err := <-s.failed:
		failure = fmt.Errorf("control API stopped serving: %w", err)
	}
	return errors.Join(failure, s.shutdown())
}
