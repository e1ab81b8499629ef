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
	"time"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/endpoint"
	"github.com/openkubelet/devmgr/podstate"
)

type lifecycle int

const (
	created lifecycle = iota
	started
	stopped
)

// ManagerImpl is the device manager. Every method is safe for concurrent use.
type ManagerImpl struct {
	opts          Options
	log           klog.Logger
	store         checkpoint.Manager
	kubeletSocket string
	updates       *queue[ResourceUpdate]
	// events is nil unless Options.Events is set.
	events  *queue[Event]
	metrics *metrics

	// ctx is cancelled by Stop; every goroutine the manager starts ends
	// with it, but the queues' senders, which their close ends.
	ctx    context.Context
	cancel context.CancelFunc
	// wg counts every goroutine the manager started, but the queues'.
	wg sync.WaitGroup
	// stopOnce makes Stop idempotent.
	stopOnce sync.Once

	// writeMu serialises checkpoint writes. It is taken before mu, never
	// while mu is held.
	writeMu sync.Mutex
	// writtenGen is the state generation the file reflects and lastBlob
	// what the file holds (nil when unknown); doc encodes the documents.
	// Guarded by writeMu.
	writtenGen uint64
	lastBlob   []byte
	doc        *checkpoint.Data

	// mu guards everything below.
	mu    sync.Mutex
	state lifecycle
	// resources holds one record per resource a plugin registered or the
	// checkpoint named.
	resources map[string]*resourceState
	ledger    *podstate.Ledger
	// reuse holds, per pod being admitted, devices its regular init containers
	// used and later containers may take again.
	reuse map[string]map[string]sets.Set[string]
	// inflight counts Allocate calls in progress per pod; such pods are
	// neither garbage-collected nor lose their reuse pool.
	inflight     map[string]int
	activePods   ActivePodsFunc
	sourcesReady SourcesReady
	containerMap podstate.ContainerMap
	running      sets.Set[string]
	// inflightRPCs holds the reservations whose plugin call is in flight,
	// with its start: checkpoint writes wait briefly for them (group
	// commit). inflightChanged is closed, and replaced, when one ends.
	inflightRPCs    map[podstate.ReservationID]time.Time
	inflightChanged chan struct{}
	// readyChanged is closed, and replaced, when a resource that was not
	// ready or listed no device gets a device list, or a resource is
	// removed: Allocate calls waiting for a plugin
	// (Options.PluginWaitTimeout) look again.
	readyChanged chan struct{}
	// commitSeq numbers commits of allocations; lastCommit holds each pod's
	// last one (garbage collection must not drop a pod admitted after it
	// read the active pods).
	commitSeq  uint64
	lastCommit map[string]uint64
	// gen counts changes of the checkpoint's content.
	gen uint64
	// connSeq numbers plugin registrations.
	connSeq  uint64
	server   *grpc.Server
	serveErr error
	// sock identifies the kubelet.sock file this manager created, and
	// dirLocks hold the flocks on SocketDir and CheckpointDir; both from
	// Start until Stop.
	sock     fs.FileInfo
	dirLocks dirLocks
	// registry maps each registry socket to the plugin it registered.
	registry map[string]registryEntry
	// connectingLocal holds the resources a RegisterLocal call is
	// connecting, so that a concurrent call for one of them is refused.
	connectingLocal sets.Set[string]
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
		opts:            opts,
		log:             opts.Logger.WithName("devicemanager"),
		store:           store,
		kubeletSocket:   filepath.Join(opts.SocketDir, KubeletSocketName),
		updates:         newUpdateQueue(),
		ctx:             ctx,
		cancel:          cancel,
		resources:       map[string]*resourceState{},
		ledger:          podstate.NewLedger(),
		reuse:           map[string]map[string]sets.Set[string]{},
		inflight:        map[string]int{},
		inflightRPCs:    map[podstate.ReservationID]time.Time{},
		lastCommit:      map[string]uint64{},
		connectingLocal: sets.New[string](),
		inflightChanged: make(chan struct{}),
		readyChanged:    make(chan struct{}),
		activePods:      func() []*v1.Pod { return nil },
		sourcesReady:    alwaysReady{},
		doc:             checkpoint.New(nil, nil),
	}
	if opts.Events {
		m.events = newQueue[Event](0, nil)
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
		m.activePods = activePods
	}
	if sourcesReady != nil {
		m.sourcesReady = sourcesReady
	}
	m.containerMap = initialContainers
	m.running = initialRunning
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
	m.server = server
	m.sock, m.dirLocks = sock, locks
	m.wg.Add(1)
	m.mu.Unlock()

	go func() {
		defer m.wg.Done()
		if err := server.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			m.mu.Lock()
			m.serveErr = err
			m.mu.Unlock()
			m.log.Error(err, "Registration server stopped serving")
		}
	}()
	if m.opts.PluginsRegistryDir != "" {
		if err := m.watchRegistry(); err != nil {
			_ = m.Stop()
			return err
		}
	}
	m.log.V(2).Info("Device manager started", keySocket, m.kubeletSocket)
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
		server, sock, locks := m.server, m.sock, m.dirLocks
		var eps []*endpoint.Endpoint
		for _, r := range m.resources {
			for _, in := range r.instances {
				eps = append(eps, in.ep)
			}
		}
		m.mu.Unlock()

		m.cancel()
		if server != nil {
			// Removed while the listener still holds the file, so that its
			// inode cannot have been reused by another's socket.
			m.removeKubeletSocket(sock)
			server.Stop()
		}
		for _, ep := range eps {
			ep.Stop()
		}
		m.wg.Wait()
		m.updates.close()
		if m.events != nil {
			m.events.close()
		}
		locks.release()
		m.log.V(2).Info("Device manager stopped")
	})
	return nil
}

// HealthCheck returns nil while the registration server serves.
func (m *ManagerImpl) HealthCheck() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.serveErr != nil:
		return fmt.Errorf("device registration error: device plugin registration gRPC server failed and no device plugins can register: %w", m.serveErr)
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
func (m *ManagerImpl) Updates() <-chan ResourceUpdate { return m.updates.out }
