package plugintest

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
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	regapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// maxSocketPathLen is the longest path a unix socket address can hold on
// Linux (sun_path is 108 bytes, one of which is the terminating NUL).
const maxSocketPathLen = 107

var (
	// ErrNotStarted is returned by methods that need a serving plugin when
	// Start has not been called yet.
	ErrNotStarted = errors.New("plugintest: plugin not started")
	// ErrStopped is returned by Start and ServeRegistry once Stop has been
	// called. A stopped Plugin cannot be restarted: create a new one with the
	// same Options to simulate a plugin restart.
	ErrStopped = errors.New("plugintest: plugin stopped")
)

// Options configures a Plugin. The zero value of every field but ResourceName
// means "default".
type Options struct {
	// ResourceName is the extended resource the plugin serves, for example
	// "example.com/gpu". Required. It is not validated, so that tests can
	// exercise the kubelet's checks.
	ResourceName string

	// SocketDir is the absolute directory of the plugin's socket, normally
	// the directory that holds kubelet.sock. Default
	// pluginapi.DevicePluginPath.
	SocketDir string

	// Endpoint is the bare file name of the plugin's socket in SocketDir; it
	// is also what Register sends as RegisterRequest.Endpoint. Default: the
	// resource name with "/" replaced by "-", plus ".sock"
	// ("example.com-gpu.sock"). A name without ".sock" is accepted, as some
	// real plugins use one.
	Endpoint string

	// Devices is the initial device list, sent by ListAndWatch until the
	// first Update. It may be empty. The Plugin keeps a copy.
	Devices []*pluginapi.Device

	// PreStartRequired and GetPreferredAllocationAvailable are returned by
	// GetDevicePluginOptions.
	PreStartRequired                bool
	GetPreferredAllocationAvailable bool

	// RegistrationOptions is sent as RegisterRequest.Options by Register.
	// nil: the options GetDevicePluginOptions returns. The kubelet ignores
	// this field; a different value lets tests check that it does.
	RegistrationOptions *pluginapi.DevicePluginOptions

	// CDIDeviceName, when set, makes the default Allocate response name one
	// CDI device per allocated device, CDIDeviceName(deviceID), for example
	// func(id string) string { return "example.com/gpu=" + id }.
	CDIDeviceName func(deviceID string) string

	// EmptyFirstMessage makes every ListAndWatch stream start with a
	// message that lists no devices, followed at once by the current list,
	// as some real plugins do.
	EmptyFirstMessage bool

	// NoReregister stops the Plugin following the kubelet. By default it
	// does as real device plugins do: once Register has succeeded, each time
	// the kubelet socket it registered on is created anew (a kubelet or
	// devmgr restarting), it serves its own socket again if it was removed
	// and registers again, until Stop (sanity's restart/re-register check).
	// Tests that restart a device manager and decide themselves when the
	// plugin comes back set it.
	NoReregister bool

	// Logger receives the plugin's logs (V(2): lifecycle and registration;
	// V(4): every RPC). Default klog.Background().
	Logger klog.Logger
}

// Plugin is a device plugin served over gRPC on a unix socket, for tests.
// Create it with New; every method is safe for concurrent use.
type Plugin struct {
	// Immutable after New.
	resource   string
	socketDir  string
	endpoint   string
	socketPath string
	options    *pluginapi.DevicePluginOptions // served by GetDevicePluginOptions
	regOptions *pluginapi.DevicePluginOptions // sent in RegisterRequest.Options
	cdiName    func(string) string
	emptyFirst bool
	logger     klog.Logger

	reregisters bool
	// kubeletCreated (capacity 1) is signalled when the kubelet socket the
	// Plugin follows is created.
	kubeletCreated chan struct{}

	// done is closed by Stop; handlers that wait select on it.
	done chan struct{}
	// stopCtx is cancelled by Stop, to end a registration in flight.
	stopCtx    context.Context
	cancelStop context.CancelFunc
	// wg counts the Serve goroutines of both gRPC servers, and the
	// re-registration loop.
	wg sync.WaitGroup

	// mu guards every field below it.
	mu        sync.Mutex
	started   bool
	stopped   bool
	server    *grpc.Server
	listener  net.Listener // the device plugin server's; nil until Start
	socket    *socketFile  // nil until Start
	registry  *grpc.Server // nil unless ServeRegistry is serving
	regSocket *socketFile  // nil unless ServeRegistry is serving
	// list is the current device list: a copy made by newList, never
	// modified, so that one message may be queued on every stream.
	list *pluginapi.ListAndWatchResponse
	// listed holds every device ID the Plugin has listed: in Options.Devices
	// or an Update.
	listed   map[string]struct{}
	watchers map[*watcher]struct{}
	// following is the kubelet socket the Plugin registers again on when
	// it is created; "" until Register succeeds.
	following string
	info      *regapi.PluginInfo // GetInfo override; nil: default
	hooks     hooks
	faults    map[Method]*fault
	calls     []Call
	// changed is closed and replaced whenever a call is recorded or a stream
	// opens or ends, to wake the Wait methods.
	changed chan struct{}
}

// watcher is one open ListAndWatch stream. Its fields are guarded by
// Plugin.mu.
type watcher struct {
	queue  []*pluginapi.ListAndWatchResponse // messages not sent yet
	wake   chan struct{}                     // capacity 1; signalled when queue or closed changes
	closed bool                              // set by CloseStreams
}

// New validates opts and returns a Plugin that is not serving yet. It touches
// no files.
func New(opts Options) (*Plugin, error) {
	if opts.ResourceName == "" {
		return nil, errors.New("plugintest: ResourceName is required")
	}
	dir := opts.SocketDir
	if dir == "" {
		dir = pluginapi.DevicePluginPath
	}
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("plugintest: SocketDir %q is not absolute", dir)
	}
	endpoint := opts.Endpoint
	if endpoint == "" {
		endpoint = strings.ReplaceAll(opts.ResourceName, "/", "-") + ".sock"
	}
	if endpoint == "." || endpoint == ".." || strings.ContainsRune(endpoint, filepath.Separator) {
		return nil, fmt.Errorf("plugintest: Endpoint %q is not a bare file name", endpoint)
	}
	socketPath := filepath.Join(dir, endpoint)
	if len(socketPath) > maxSocketPathLen {
		return nil, fmt.Errorf("plugintest: socket path %q is longer than %d bytes; use a shorter SocketDir",
			socketPath, maxSocketPathLen)
	}
	served := &pluginapi.DevicePluginOptions{
		PreStartRequired:                opts.PreStartRequired,
		GetPreferredAllocationAvailable: opts.GetPreferredAllocationAvailable,
	}
	regOptions := served
	if opts.RegistrationOptions != nil {
		regOptions = proto.CloneOf(opts.RegistrationOptions)
	}
	logger := opts.Logger
	if logger.GetSink() == nil {
		logger = klog.Background()
	}
	stopCtx, cancelStop := context.WithCancel(context.Background())
	p := &Plugin{
		resource:   opts.ResourceName,
		socketDir:  dir,
		endpoint:   endpoint,
		socketPath: socketPath,
		options:    served,
		regOptions: regOptions,
		cdiName:    opts.CDIDeviceName,
		emptyFirst: opts.EmptyFirstMessage,
		logger:     logger.WithValues("resourceName", opts.ResourceName),

		reregisters:    !opts.NoReregister,
		kubeletCreated: make(chan struct{}, 1),

		done:       make(chan struct{}),
		stopCtx:    stopCtx,
		cancelStop: cancelStop,
		list:       newList(opts.Devices),
		listed:     make(map[string]struct{}),
		watchers:   make(map[*watcher]struct{}),
		faults:     make(map[Method]*fault),
		changed:    make(chan struct{}),
	}
	p.addListedLocked(p.list)
	return p, nil
}

// ResourceName returns Options.ResourceName.
func (p *Plugin) ResourceName() string { return p.resource }

// Endpoint returns the bare file name of the plugin's socket.
func (p *Plugin) Endpoint() string { return p.endpoint }

// SocketPath returns the absolute path of the plugin's socket.
func (p *Plugin) SocketPath() string { return p.socketPath }

// Start removes a stale socket left at SocketPath, listens there and serves
// the DevicePlugin service. Clients may connect as soon as it returns. It
// fails if called twice, after Stop, or if something other than a socket is
// at SocketPath.
func (p *Plugin) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.stopped:
		return ErrStopped
	case p.started:
		return errors.New("plugintest: plugin already started")
	}
	lis, sock, err := listenUnix(p.socketPath)
	if err != nil {
		return err
	}
	p.listener, p.socket = lis, sock
	p.server = grpc.NewServer(grpc.WaitForHandlers(true))
	pluginapi.RegisterDevicePluginServer(p.server, &deviceService{p: p})
	p.serveLocked(p.server, lis)
	p.started = true
	setLatestOnPath(p.socketPath, p)
	p.logger.V(2).Info("Device plugin serving", "socketPath", p.socketPath)
	return nil
}

// Stop ends every ListAndWatch stream and in-flight call, stops the plugin
// and registry servers, removes their sockets, and returns when every
// goroutine the Plugin started has ended. It is idempotent and may be called
// before Start, so t.Cleanup(p.Stop) is always right.
func (p *Plugin) Stop() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.stopped = true
	close(p.done)
	p.cancelStop()
	servers := []*grpc.Server{p.registry, p.server}
	// serveAgain, which replaces p.socket, does nothing once stopped is set.
	sockets := []*socketFile{p.regSocket, p.socket}
	p.registry, p.regSocket = nil, nil
	following := p.following
	p.mu.Unlock()

	// Stop waits for handlers (WaitForHandlers), which return once done is
	// closed or their context is cancelled; the lock must not be held.
	for _, s := range servers {
		if s != nil {
			s.Stop()
		}
	}
	p.wg.Wait()
	if following != "" {
		watchHub.unsubscribe(p, following)
	}
	forgetOnPath(p.socketPath, p)
	for _, sock := range sockets {
		sock.remove(p.logger)
	}
	p.logger.V(2).Info("Device plugin stopped", "socketPath", p.socketPath)
}

// Devices returns a copy of the current device list.
func (p *Plugin) Devices() []*pluginapi.Device {
	p.mu.Lock()
	list := p.list
	p.mu.Unlock()
	return copyDevices(list.Devices) // never modified: copied without the lock
}

// Update replaces the device list with a copy of devices and queues it on
// every open ListAndWatch stream; streams opened later start with it. Every
// Update is delivered, in order, to every stream open when it is called.
func (p *Plugin) Update(devices []*pluginapi.Device) {
	list := newList(devices) // the caller's slice, copied without the lock
	p.mu.Lock()
	defer p.mu.Unlock()
	p.list = list
	p.addListedLocked(list)
	for w := range p.watchers {
		w.queue = append(w.queue, p.list)
		notify(w.wake)
	}
	p.logger.V(4).Info("Device list updated", "devices", len(devices), "streams", len(p.watchers))
}

// CloseStreams ends every open ListAndWatch stream with an OK status (the
// client's Recv returns io.EOF), dropping messages not sent yet, as a plugin
// whose stream ends. The server keeps serving; new streams may be opened.
func (p *Plugin) CloseStreams() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for w := range p.watchers {
		w.closed = true
		notify(w.wake)
		delete(p.watchers, w)
	}
	p.broadcastLocked()
}

// Streams returns the number of open ListAndWatch streams that receive
// Update.
func (p *Plugin) Streams() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.watchers)
}

// addListedLocked adds the IDs of list to those the Plugin has listed.
func (p *Plugin) addListedLocked(list *pluginapi.ListAndWatchResponse) {
	for _, d := range list.Devices {
		if d != nil {
			p.listed[d.ID] = struct{}{}
		}
	}
}

// subscribe adds a stream that starts with the current list.
func (p *Plugin) subscribe() (*watcher, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return nil, ErrStopped
	}
	w := &watcher{wake: make(chan struct{}, 1)}
	if p.emptyFirst {
		w.queue = append(w.queue, &pluginapi.ListAndWatchResponse{})
	}
	w.queue = append(w.queue, p.list)
	notify(w.wake)
	p.watchers[w] = struct{}{}
	p.broadcastLocked()
	return w, nil
}

// unsubscribe removes w if CloseStreams has not already.
func (p *Plugin) unsubscribe(w *watcher) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.watchers[w]; ok {
		delete(p.watchers, w)
		p.broadcastLocked()
	}
}

// next takes the messages queued on w; closed reports that CloseStreams ended
// the stream.
func (p *Plugin) next(w *watcher) (msgs []*pluginapi.ListAndWatchResponse, closed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	msgs, w.queue = w.queue, nil
	return msgs, w.closed
}

// serveLocked starts the Serve goroutine of s, owned by p.wg.
func (p *Plugin) serveLocked(s *grpc.Server, lis net.Listener) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		// net.ErrClosed: serveAgain replaced the listener.
		if err := s.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, net.ErrClosed) {
			p.logger.Error(err, "gRPC server ended", "socketPath", lis.Addr().String())
		}
	}()
}

// broadcastLocked wakes every Wait method.
func (p *Plugin) broadcastLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// notify wakes the owner of a capacity-1 channel without blocking.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// socketFile is a unix socket this Plugin created.
type socketFile struct {
	path string
	info fs.FileInfo // identifies the file, so that another's is never removed
}

// listenUnix listens on path after removing a stale socket there. The
// listener does not unlink the file when closed: socketFile.remove does.
func listenUnix(path string) (net.Listener, *socketFile, error) {
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.Mode().Type() != fs.ModeSocket:
		return nil, nil, fmt.Errorf("plugintest: %s exists and is not a socket", path)
	case err == nil:
		if err := os.Remove(path); err != nil {
			return nil, nil, fmt.Errorf("plugintest: remove stale socket: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, nil, fmt.Errorf("plugintest: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, nil, fmt.Errorf("plugintest: listen: %w", err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	fi, err = os.Lstat(path)
	if err != nil {
		_ = lis.Close()
		return nil, nil, fmt.Errorf("plugintest: %w", err)
	}
	return lis, &socketFile{path: path, info: fi}, nil
}

// remove removes the socket unless it is gone or is no longer this one: a
// new Plugin on the same path (a simulated restart) keeps its socket when
// the old one stops. A nil socketFile is a no-op.
func (s *socketFile) remove(logger klog.Logger) {
	if s == nil {
		return
	}
	fi, err := os.Lstat(s.path)
	if err != nil || !os.SameFile(fi, s.info) {
		return
	}
	if err := os.Remove(s.path); err != nil {
		logger.Error(err, "Cannot remove socket", "socketPath", s.path)
	}
}

// newList returns the message that sends devices: a copy, made once, that
// the streams share and nobody modifies, so that what a caller does to its
// devices after Update or New never reaches a stream.
func newList(devices []*pluginapi.Device) *pluginapi.ListAndWatchResponse {
	return &pluginapi.ListAndWatchResponse{Devices: copyDevices(devices)}
}

// copyDevices deep-copies devices as they are: nil and empty lists, nil
// entries and nodes, empty node lists, and fields unknown to the API (a test
// may send them on purpose) all stay as they were. It copies the fields of
// the three messages by hand rather than through proto.CloneOf, which walks
// them by reflection, as it lies on the path from Update to every stream; a
// test fills every field the API defines, so that one added to the API
// cannot be left out unnoticed.
func copyDevices(devices []*pluginapi.Device) []*pluginapi.Device {
	if devices == nil {
		return nil
	}
	out := make([]*pluginapi.Device, len(devices))
	for i, d := range devices {
		if d == nil {
			continue
		}
		c := &pluginapi.Device{ID: d.ID, Health: d.Health, Topology: copyTopology(d.Topology)}
		copyUnknown(c, d)
		out[i] = c
	}
	return out
}

func copyTopology(t *pluginapi.TopologyInfo) *pluginapi.TopologyInfo {
	if t == nil {
		return nil
	}
	c := &pluginapi.TopologyInfo{}
	if t.Nodes != nil {
		c.Nodes = make([]*pluginapi.NUMANode, len(t.Nodes))
		for i, n := range t.Nodes {
			if n != nil {
				c.Nodes[i] = &pluginapi.NUMANode{ID: n.ID}
				copyUnknown(c.Nodes[i], n)
			}
		}
	}
	copyUnknown(c, t)
	return c
}

// copyUnknown gives dst a copy of the unknown fields of src.
func copyUnknown(dst, src proto.Message) {
	if u := src.ProtoReflect().GetUnknown(); len(u) > 0 {
		dst.ProtoReflect().SetUnknown(slices.Clone(u))
	}
}
