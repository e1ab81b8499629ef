package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/dra"
	"github.com/openkubelet/devmgr/internal/unixsock"
	"github.com/openkubelet/devmgr/podadmit"
)

const (
	// restoreTimeout bounds the rebuilding of the restored pods' answers.
	restoreTimeout = 10 * time.Second
	// drainTimeout is how long shutdown lets control requests finish before
	// it cancels them, and then again before it closes their connections.
	drainTimeout = 3 * time.Second
	// watchInterval is how often the manager's state is polled for logging
	// and for retiring resources whose plugin is gone (the kubelet's node
	// status loop runs every 10s; a fake kubelet answers faster).
	watchInterval = time.Second
)

// server is a running "devmgr serve": the device manager, the node of pods
// admitted through the control socket, the control API, the watch loop and,
// with --kubeconfig, the node status publisher.
type server struct {
	log  klog.Logger
	mgr  *devicemanager.ManagerImpl
	http *http.Server
	ctl  *ownedSocket
	// extras are the optional servers: podresources and metrics.
	extras *extras
	// drv is the DRA driver (--dra); nil without it.
	drv *dra.Driver
	// ready is what /readyz of the metrics server reports.
	ready *readiness
	// failed receives the control API's error if it stops serving on its own.
	failed chan error
	// cancel ends the watch loop, the publisher and every control
	// request; wg waits for the goroutines the server started.
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// readyFunc adapts a function to devicemanager.SourcesReady.
type readyFunc func() bool

func (f readyFunc) AllReady() bool { return f() }

// startServer starts everything in the order the kubelet would: the admitted
// pods are read first, the manager starts (removing stale sockets and
// restoring its checkpoint), the pods are taken back, and only then does
// the control socket accept requests. On error, whatever was started is
// stopped again.
func startServer(cfg serveConfig, logger klog.Logger) (_ *server, err error) {
	store := newPodStore(cfg.checkpointDir)
	pods, err := store.load()
	if err != nil {
		return nil, err
	}
	if err := removeStaleSocket(cfg.controlSocket, logger); err != nil {
		return nil, err
	}

	mgr, err := devicemanager.NewManagerImpl(devicemanager.Options{
		SocketDir:          cfg.socketDir,
		CheckpointDir:      cfg.checkpointDir,
		NUMANodes:          cfg.numaNodes,
		RequirePlugin:      cfg.requirePlugin,
		StopGracePeriod:    cfg.stopGracePeriod,
		PluginWaitTimeout:  cfg.pluginWait,
		SendPodInfo:        cfg.sendPodInfo,
		Logger:             logger,
		Registerer:         cfg.registerer(),
		AffinityStore:      cfg.affinityStore(),
		PluginsRegistryDir: cfg.pluginsRegistryDir,
	})
	if err != nil {
		return nil, fmt.Errorf("device manager: %w", err)
	}
	pub, err := newPublisher(cfg, mgr, logger)
	if err != nil {
		mgr.Stop()
		return nil, err
	}
	slicePub, err := newSlicePublisher(cfg, mgr, logger)
	if err != nil {
		mgr.Stop()
		return nil, err
	}
	adm := podadmit.New(mgr)
	switch {
	case cfg.store != nil && cfg.podScope:
		adm.SetPodTopology(cfg.store, cfg.policy, mgr)
	case cfg.store != nil:
		adm.SetTopology(cfg.store, cfg.policy, mgr)
	}
	// Until the admitted pods are back, the manager must not collect their
	// devices: its pod sources are not ready.
	var restored atomic.Bool
	if err := mgr.Start(adm.ActivePods, readyFunc(restored.Load), nil, nil); err != nil {
		mgr.Stop()
		return nil, fmt.Errorf("start device manager: %w", err)
	}
	defer func() {
		if err != nil {
			mgr.Stop()
		}
	}()
	// The directories are this serve's now (Start refuses them, touching
	// nothing, while another manager works there).
	store.removeTempFiles(logger)
	if len(pods) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout)
		err := adm.Restore(ctx, pods)
		cancel()
		if err != nil {
			logger.Error(err, "Some admitted pods were restored without all their run options")
		}
		logger.Info("Restored admitted pods", "count", len(adm.Pods()), "path", store.path)
	}
	restored.Store(true)
	// What the checkpoint holds for a pod the pod file lacks belongs to an
	// admission that was never acknowledged (a kill cut it short): release it
	// now, so that status, pods and podresources agree from the first answer.
	mgr.UpdateAllocatedDevices()

	ready := &readiness{health: mgr.HealthCheck}
	ex, err := startExtras(cfg, mgr, adm, ready.check, logger)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			ex.stop()
		}
	}()
	// Prepared claims are back with the checkpoint: the kubelet may ask.
	drv, err := startDRADriver(context.Background(), cfg, mgr, logger)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && drv != nil {
			drv.Stop()
		}
	}()
	ctl, err := listenOwned(cfg.controlSocket)
	if err != nil {
		return nil, err
	}
	base, cancel := context.WithCancel(context.Background())
	cs := &controlServer{
		status:   mgr.Status,
		admitter: adm,
		info:     managerJSON{SocketDir: cfg.socketDir, CheckpointDir: cfg.checkpointDir, NUMANodes: cfg.numaNodes},
		record:   func() error { return store.sync(adm.AdmittedPods) },
		log:      logger.WithName("control"),
	}
	s := &server{
		log: logger,
		mgr: mgr,
		http: &http.Server{
			Handler:           cs.handler(),
			BaseContext:       func(net.Listener) context.Context { return base },
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          log.New(logWriter{logger.WithName("http")}, "", 0),
		},
		ctl:    ctl,
		extras: ex,
		drv:    drv,
		ready:  ready,
		failed: make(chan error, 1),
		cancel: cancel,
	}
	w := &watcher{mgr: mgr, log: logger}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := s.http.Serve(ctl); !errors.Is(err, http.ErrServerClosed) {
			s.failed <- err
		}
	}()
	go func() {
		defer s.wg.Done()
		w.run(base, watchInterval)
	}()
	if pub != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = pub.Run(base) // returns when shutdown cancels base
		}()
		logger.Info("Publishing device resources in the node status", "node", cfg.nodeName, "registerNode", cfg.registerNode,
			"kubeconfig", cfg.kubeconfigSource)
	}
	if slicePub != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := slicePub.Run(base); err != nil && !errors.Is(err, context.Canceled) {
				logger.Error(err, "Not publishing ResourceSlices")
			}
		}()
	}
	// Connections the listener accepted meanwhile are served from now on.
	ready.serving.Store(true)
	logger.Info("Serving", "socketPath", filepath.Join(cfg.socketDir, devicemanager.KubeletSocketName), "controlSocket", cfg.controlSocket,
		"checkpointDir", cfg.checkpointDir, "numaNodes", cfg.numaNodes, "topologyPolicy", cfg.policy.Name(), "topologyPodScope", cfg.podScope)
	return s, nil
}

// shutdown reports not ready on /readyz, removes the control socket if it
// is still the one the server created, lets control requests finish (cancelling them if they take too
// long), and stops the watch loop, the publisher and the manager. The
// manager removes kubelet.sock; plugins' sockets are left alone.
func (s *server) shutdown() error {
	s.ready.serving.Store(false)
	// Removed while the listener still holds the file, so that its inode
	// cannot have been reused by another's socket.
	rmErr := s.ctl.remove()
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	err := s.http.Shutdown(ctx)
	cancel()
	if err != nil {
		// Requests still run (say an admission waiting for a slow plugin):
		// cancel them and give their handlers time to return.
		s.cancel()
		ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
		if err := s.http.Shutdown(ctx); err != nil {
			_ = s.http.Close()
		}
		cancel()
	}
	s.cancel()
	s.wg.Wait()
	s.extras.stop()
	if s.drv != nil {
		s.drv.Stop()
	}
	s.mgr.Stop()
	if rmErr != nil {
		return fmt.Errorf("remove control socket: %w", rmErr)
	}
	s.log.Info("Stopped")
	return nil
}

// ownedSocket is a unix listener whose file is removed at the end only if
// it is still the file this process created.
type ownedSocket struct {
	net.Listener
	path string
	info fs.FileInfo
}

// controlSocketMode lets only the owner connect to the control socket:
// whoever reaches it can admit and release pods, and the CLI that does so
// runs as the user who runs serve (root on a node).
const controlSocketMode = 0o600

// listenOwned listens on the unix socket path, created with
// controlSocketMode whatever the umask.
func listenOwned(path string) (*ownedSocket, error) {
	l, err := unixsock.Listen(path, controlSocketMode)
	if err != nil {
		return nil, fmt.Errorf("listen on control socket: %w", err)
	}
	// The file is removed by remove, after checking it is still ours.
	l.SetUnlinkOnClose(false)
	fi, err := os.Lstat(path)
	if err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return &ownedSocket{Listener: l, path: path, info: fi}, nil
}

func (s *ownedSocket) remove() error {
	fi, err := os.Lstat(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !os.SameFile(fi, s.info) {
		return nil // replaced by someone else's socket
	}
	return os.Remove(s.path)
}

// socketInUse reports whether something accepts connections on the unix
// socket path.
func socketInUse(path string) bool {
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// removeStaleSocket removes a socket left at path by an earlier run. Nothing
// at path is fine; a socket something still serves, or a file that is not a
// socket, is an error.
func removeStaleSocket(path string, logger klog.Logger) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("control socket: %w", err)
	case fi.Mode().Type() != fs.ModeSocket:
		return fmt.Errorf("control socket %s exists and is not a socket; remove it or choose another --control-socket", path)
	case socketInUse(path):
		return fmt.Errorf("control socket %s is in use: is another devmgr serve running?", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale control socket: %w", err)
	}
	logger.Info("Removed stale control socket", "path", path)
	return nil
}

// logWriter turns the HTTP server's log lines into log entries.
type logWriter struct{ log klog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info("HTTP server error", "err", strings.TrimSpace(string(p)))
	return len(p), nil
}
