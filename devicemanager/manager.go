package devicemanager

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	regapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/internal/queue"
	"github.com/openkubelet/devmgr/pluginwatcher"
	"github.com/openkubelet/devmgr/podstate"
)

type lifecycle int

const (
	created lifecycle = iota
	started
	stopped
)

// ManagerImpl is the device manager. Every method is safe for concurrent use.
//
// Its state and the rules that change it are the core's (core.go); the
// manager holds the lock around the core, runs the goroutines, calls the
// plugins and writes the checkpoint.
type ManagerImpl struct {
	opts    Options
	log     klog.Logger
	metrics *metrics
	updates *queue.Queue[ResourceUpdate]
	// events is nil unless Options.Events is set.
	events *queue.Queue[Event]
	// writer writes the checkpoint; its lock is taken before mu, never
	// while mu is held.
	writer checkpointWriter

	// ctx is cancelled by Stop; every goroutine the manager starts ends
	// with it, but the queues' senders, which their close ends.
	ctx    context.Context
	cancel context.CancelFunc
	// wg counts every goroutine the manager started, but the queues'.
	wg sync.WaitGroup
	// stopOnce makes Stop idempotent.
	stopOnce sync.Once

	// mu guards everything below.
	mu    sync.Mutex
	state lifecycle
	core  *core
	// podSource is what the embedder tells of its pods.
	podSource podSource
	// readyChanged wakes Allocate calls waiting for a plugin
	// (Options.PluginWaitTimeout); settled wakes checkpoint writes waiting
	// for plugin calls in flight (the group commit).
	readyChanged, settled broadcast
	// serving is what Start set up, until Stop.
	serving serving
	// connectingLocal holds the resources a RegisterLocal call is
	// connecting, so that a concurrent call for one of them is refused.
	connectingLocal sets.Set[string]
}

// podSource is what the embedder tells the manager of its pods at Start.
type podSource struct {
	activePods   ActivePodsFunc
	sourcesReady SourcesReady
	containerMap podstate.ContainerMap
	running      sets.Set[string]
}

// alreadyRunning reports whether the container was running when the
// manager started while the pod sources are not ready yet: then it is not
// checked again (the kubelet's rule).
func (p podSource) alreadyRunning(podUID, container string) bool {
	return !p.sourcesReady.AllReady() && p.containerMap.IsRunning(podUID, container, p.running)
}

// serving is the registration server and what Start claimed for it.
type serving struct {
	server *grpc.Server
	err    error // why the server stopped serving, if it did
	// sock identifies the kubelet.sock file this manager created, and
	// locks hold the flocks on SocketDir and CheckpointDir.
	sock  fs.FileInfo
	locks dirLocks
	// watcher watches Options.PluginsRegistryDir; nil when it is not set.
	watcher *pluginwatcher.Watcher
}

// broadcast wakes every waiter at once. Use it under the lock that guards
// it.
type broadcast struct{ ch chan struct{} }

// wait returns a channel closed at the next notify.
func (b *broadcast) wait() <-chan struct{} {
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) notify() {
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// signal carries out, under m.mu, what eff asks of the manager besides the
// checkpoint write: the sends on Updates and Events, queued before the
// change is visible to others, and the wake-ups. Expects m.mu held.
func (m *ManagerImpl) signal(eff effects) {
	if len(eff.notify) > 0 {
		m.updates.Push(ResourceUpdate{PodUIDs: eff.notify})
	}
	if m.events != nil {
		m.events.Push(eff.events...)
	}
	if eff.ready {
		m.readyChanged.notify()
	}
	if eff.settled {
		m.settled.notify()
	}
}

// persistFor writes the checkpoint when eff asks for it, logging a failure
// with what. Expects m.mu not held.
func (m *ManagerImpl) persistFor(eff effects, what string) {
	if !eff.write {
		return
	}
	if err := m.persist(eff.gen); err != nil {
		m.log.Error(err, "Failed to write checkpoint "+what)
	}
}

// kubeletSocket is the path of the registration socket.
func (m *ManagerImpl) kubeletSocket() string {
	return filepath.Join(m.opts.SocketDir, KubeletSocketName)
}

// NewManagerImpl returns a manager configured by opts. It validates the
// options (directories must be absolute) and touches no files; Start does.
func NewManagerImpl(opts Options) (*ManagerImpl, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	store, err := checkpoint.NewManager(opts.CheckpointDir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &ManagerImpl{
		opts:    opts,
		log:     opts.Logger.WithName("devicemanager"),
		updates: newUpdateQueue(),
		writer:  checkpointWriter{store: store, doc: checkpoint.New(nil, nil)},
		ctx:     ctx,
		cancel:  cancel,
		core: newCore(limits{
			maxResources: opts.MaxResources, maxInstances: opts.MaxInstancesPerResource,
			maxDevices: opts.MaxDevicesPerResource, grace: opts.StopGracePeriod,
			numaNodes: opts.NUMANodes, events: opts.Events,
		}),
		podSource:       podSource{activePods: func() []*v1.Pod { return nil }, sourcesReady: alwaysReady{}},
		connectingLocal: sets.New[string](),
	}
	if opts.Events {
		m.events = queue.New[Event](0, nil)
	}
	if m.metrics, err = newMetrics(m, opts.Registerer); err != nil {
		cancel()
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	return m, nil
}

type alwaysReady struct{}

func (alwaysReady) AllReady() bool { return true }

// Start creates SocketDir (0750) and CheckpointDir if missing and claims
// them. It fails with an error wrapping ErrSocketInUse, having touched
// nothing in them, when another manager holds either (an exclusive flock on
// the directory itself, held until Stop: no file of devmgr's appears where
// the kubelet keeps its sockets) or when SocketDir/kubelet.sock accepts
// connections (a running kubelet, which takes no such lock).
//
// Once the directory is its own, Start labels it for SELinux as the kubelet
// does (when SELinux is enabled), reads the checkpoint, removes every unix
// socket in SocketDir (never regular files, directories or links) and
// listens on SocketDir/kubelet.sock, created with mode 0660. A kubelet.sock
// that refused the connection is stale. Plugin sockets are removed even if
// their plugin still serves, as the kubelet does: plugins of the previous
// run notice (they watch for kubelet.sock to be created, or for their own
// socket to go) and register again.
//
// nil activePods, sourcesReady, initialContainers or initialRunning mean: no
// pods, always ready, none running.
//
// A checkpoint that cannot be read (corrupt, bad JSON, unreadable) is logged,
// moved aside as kubelet_internal_checkpoint.bad-<unix time>, and Start goes
// on with no allocations.
//
// When activePods is given and sourcesReady is nil or ready, Start releases,
// before it returns, what the checkpoint holds for pods activePods does not
// list (an admission a crash cut short, a pod that ended while the manager
// was down): every getter then agrees with the active pods from the first
// call on. This does not write the checkpoint. An embedder whose pod list is
// not complete at Start passes a sourcesReady that reports false until it
// is, then calls UpdateAllocatedDevices once.
func (m *ManagerImpl) Start(activePods ActivePodsFunc, sourcesReady SourcesReady,
	initialContainers podstate.ContainerMap, initialRunning sets.Set[string]) error {
	m.mu.Lock()
	switch m.state {
	case started:
		m.mu.Unlock()
		return errors.New("device manager already started")
	case stopped:
		m.mu.Unlock()
		return ErrStopped
	}
	if activePods != nil {
		m.podSource.activePods = activePods
	}
	if sourcesReady != nil {
		m.podSource.sourcesReady = sourcesReady
	}
	m.podSource.containerMap = initialContainers
	m.podSource.running = initialRunning
	reconcile := activePods != nil
	m.mu.Unlock()

	for _, dir := range []string{m.opts.SocketDir, m.opts.CheckpointDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("create directory: %w", err)
		}
	}
	locks, err := lockDirs(m.opts.SocketDir, m.opts.CheckpointDir)
	if err != nil {
		return err
	}
	lis, sock, err := m.claimSocketDir(reconcile)
	if err != nil {
		locks.release()
		return err
	}
	// Stop waits for Register handlers too, so none outlives the manager.
	server := grpc.NewServer(grpc.WaitForHandlers(true))
	pluginapi.RegisterRegistrationServer(server, &registrationServer{m: m})

	m.mu.Lock()
	if m.state != created { // Stop ran meanwhile
		m.mu.Unlock()
		m.removeKubeletSocket(sock)
		_ = lis.Close()
		locks.release()
		return ErrStopped
	}
	m.state = started
	m.serving = serving{server: server, sock: sock, locks: locks}
	m.wg.Add(1)
	m.mu.Unlock()

	go func() {
		defer m.wg.Done()
		if err := server.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			m.mu.Lock()
			m.serving.err = err
			m.mu.Unlock()
			m.log.Error(err, "Registration server stopped serving")
		}
	}()
	if m.opts.PluginsRegistryDir != "" {
		w, err := pluginwatcher.Start(pluginwatcher.Options{
			Dir:         m.opts.PluginsRegistryDir,
			Handlers:    map[string]pluginwatcher.Handler{regapi.DevicePlugin: m.GetWatcherHandler()},
			CallTimeout: m.opts.DialTimeout,
			Logger:      m.log,
		})
		if err != nil {
			_ = m.Stop()
			return err
		}
		m.mu.Lock()
		stopping := m.state != started
		m.serving.watcher = w
		m.mu.Unlock()
		if stopping { // Stop ran meanwhile, without the watcher
			w.Stop()
			return ErrStopped
		}
	}
	m.log.V(2).Info("Device manager started", keySocket, m.kubeletSocket())
	return nil
}

// claimSocketDir checks that nothing serves kubelet.sock and, that passed,
// prepares the directory, restores the checkpoint (releasing what inactive
// pods held when reconcile is set) and listens on kubelet.sock. The caller
// holds the directory's lock.
func (m *ManagerImpl) claimSocketDir(reconcile bool) (*net.UnixListener, fs.FileInfo, error) {
	if err := m.checkKubeletSocket(); err != nil {
		return nil, nil, err
	}
	m.labelSocketDir()
	m.readCheckpoint()
	if reconcile {
		m.collectInactivePods(ReleasePodInactiveAtStart)
	}
	m.removeTempFiles()
	if err := m.removeStaleSockets(); err != nil {
		return nil, nil, err
	}
	return m.listenKubeletSocket()
}

// Stop disconnects every plugin, closes kubelet.sock and removes it if the
// file is still the one Start created, releases SocketDir for another
// manager, and returns when every goroutine the manager started has ended.
// It does not write the checkpoint. Idempotent; safe before Start. After Stop
// the getters keep answering from the last state, Allocate fails with
// ErrStopped, and the Updates and Events channels are closed (events not yet
// received are kept for UndeliveredEvents).
func (m *ManagerImpl) Stop() error {
	m.stopOnce.Do(func() {
		m.mu.Lock()
		m.state = stopped
		srv := m.serving
		eps := m.core.endpoints()
		m.mu.Unlock()

		m.cancel()
		if srv.watcher != nil {
			// No registration through the registry starts after this.
			srv.watcher.Stop()
		}
		if srv.server != nil {
			// Removed while the listener still holds the file, so that its
			// inode cannot have been reused by another's socket.
			m.removeKubeletSocket(srv.sock)
			srv.server.Stop()
		}
		for _, ep := range eps {
			ep.Stop()
		}
		m.wg.Wait()
		m.updates.Close()
		if m.events != nil {
			m.events.Close()
		}
		srv.locks.release()
		m.log.V(2).Info("Device manager stopped")
	})
	return nil
}

// HealthCheck returns nil while the registration server serves.
func (m *ManagerImpl) HealthCheck() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.serving.err != nil:
		return fmt.Errorf("device registration error: device plugin registration gRPC server failed and no device plugins can register: %w", m.serving.err)
	case m.state == created:
		return errors.New("device registration error: device manager is not started")
	case m.state == stopped:
		return ErrStopped
	}
	return nil
}

// Updates returns the channel on which the manager names pods whose allocated
// devices changed health. No pod UID is ever dropped: while the reader is slow,
// pending UIDs are merged into the next update. The channel is closed by Stop.
func (m *ManagerImpl) Updates() <-chan ResourceUpdate { return m.updates.Out() }
