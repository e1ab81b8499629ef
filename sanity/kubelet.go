package sanity

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/internal/pluginreg"
	"github.com/openkubelet/devmgr/internal/unixsock"
)

// registration is one Register request the suite's kubelet received, and
// what became of it.
type registration struct {
	req *pluginapi.RegisterRequest
	// err is what Register answered: a rule the request broke, or the
	// failure to dial the plugin back and fetch its options.
	err error
	// path is the plugin's socket, when the endpoint was valid, and dialErr
	// the failure to reach it there and fetch its options.
	path    string
	dialErr error
	// conn and options are the plugin's connection and options, when the
	// dial-back answered.
	conn    *grpc.ClientConn
	options *pluginapi.DevicePluginOptions
}

// kubelet plays the kubelet's side of registration in a socket directory:
// it serves kubelet.sock, checks each RegisterRequest as the kubelet does,
// dials the plugin back within the call and fetches its options, and keeps
// every request it received.
type kubelet struct {
	dir         string
	callTimeout time.Duration

	mu      sync.Mutex
	regs    []*registration
	changed chan struct{} // closed and replaced when a request arrives
	server  *grpc.Server
	done    chan struct{} // closed when the server's goroutine ends
}

func newKubelet(dir string, callTimeout time.Duration) *kubelet {
	return &kubelet{dir: dir, callTimeout: callTimeout, changed: make(chan struct{})}
}

func (k *kubelet) socket() string { return filepath.Join(k.dir, kubeletSocketName) }

// start does what a starting kubelet does in the directory: refuses it when
// something serves kubelet.sock, removes every socket there (so plugins have
// to notice and register again), and serves kubelet.sock.
func (k *kubelet) start() error {
	if conn, err := net.DialTimeout("unix", k.socket(), time.Second); err == nil {
		_ = conn.Close()
		return fmt.Errorf("%s accepts connections: a kubelet or a device manager serves this directory; stop it or choose another", k.socket())
	}
	entries, err := os.ReadDir(k.dir)
	if err != nil {
		return fmt.Errorf("list socket directory: %w", err)
	}
	for _, e := range entries {
		if e.Type() == fs.ModeSocket {
			if err := os.Remove(filepath.Join(k.dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("remove stale socket: %w", err)
			}
		}
	}
	lis, err := unixsock.Listen(k.socket(), 0o660)
	if err != nil {
		return err
	}
	// A client gets callTimeout to finish its handshake: gRPC's default,
	// two minutes, would let a silent one hold stop that long.
	server := grpc.NewServer(grpc.WaitForHandlers(true), grpc.ConnectionTimeout(k.callTimeout))
	pluginapi.RegisterRegistrationServer(server, registrationService{k: k})
	done := make(chan struct{})
	k.mu.Lock()
	k.server, k.done = server, done
	k.mu.Unlock()
	go func() {
		defer close(done)
		_ = server.Serve(lis)
	}()
	return nil
}

// stop stops serving kubelet.sock and removes it, as a kubelet that exits.
// Register calls in flight get up to callTimeout to be answered; then every
// connection to kubelet.sock is cut, so that a client that connects and
// sends nothing cannot hold the suite.
func (k *kubelet) stop() {
	k.mu.Lock()
	server, done := k.server, k.done
	k.server = nil
	k.mu.Unlock()
	if server == nil {
		return
	}
	graceful := make(chan struct{})
	go func() {
		defer close(graceful)
		server.GracefulStop()
	}()
	timer := time.NewTimer(k.callTimeout)
	defer timer.Stop()
	select {
	case <-graceful:
	case <-timer.C:
		server.Stop()
		<-graceful
	}
	<-done
}

// disconnect closes every connection to a plugin, which ends their
// streams and calls, as when a kubelet exits.
func (k *kubelet) disconnect() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, r := range k.regs {
		if r.conn != nil {
			_ = r.conn.Close()
		}
	}
}

// close stops the kubelet and closes every connection to a plugin.
func (k *kubelet) close() {
	k.stop()
	k.disconnect()
}

// latest returns the newest registration for which match is true, nil if
// none.
func (k *kubelet) latest(match func(*registration) bool) *registration {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, r := range slices.Backward(k.regs) {
		if match(r) {
			return r
		}
	}
	return nil
}

// wait returns the first registration after the first skip ones for which
// match is true, waiting until ctx ends.
func (k *kubelet) wait(ctx context.Context, skip int, match func(*registration) bool) (*registration, error) {
	for {
		k.mu.Lock()
		regs, changed := k.regs, k.changed
		k.mu.Unlock()
		for _, r := range regs[min(skip, len(regs)):] {
			if match(r) {
				return r, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		}
	}
}

// received returns how many Register requests arrived so far, and their
// resource names.
func (k *kubelet) received() (int, []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	names := make([]string, len(k.regs))
	for i, r := range k.regs {
		names[i] = r.req.GetResourceName()
	}
	return len(k.regs), names
}

type registrationService struct {
	pluginapi.UnimplementedRegistrationServer
	k *kubelet
}

func (s registrationService) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k := s.k
	r := &registration{req: proto.Clone(req).(*pluginapi.RegisterRequest)}
	path, perr := pluginreg.EndpointPath(k.dir, req.Endpoint)
	r.err = errors.Join(pluginreg.CheckVersion(req.Version), pluginreg.CheckResourceName(req.ResourceName), perr)
	if perr == nil {
		// Dialled even when the request broke a rule, unlike the kubelet,
		// so that the other checks can still run against the plugin.
		r.path = path
		r.conn, r.options, r.dialErr = dialPlugin(ctx, path, k.callTimeout)
		r.err = errors.Join(r.err, r.dialErr)
	}
	k.mu.Lock()
	k.regs = append(k.regs, r)
	close(k.changed)
	k.changed = make(chan struct{})
	k.mu.Unlock()
	if r.err != nil {
		return &pluginapi.Empty{}, status.Error(codes.Unknown, r.err.Error())
	}
	return &pluginapi.Empty{}, nil
}

// dialPlugin connects to the plugin's socket and fetches its options, within
// timeout, as the kubelet does while it handles Register.
func dialPlugin(ctx context.Context, path string, timeout time.Duration) (*grpc.ClientConn, *pluginapi.DevicePluginOptions, error) {
	if fi, err := os.Stat(path); err != nil || fi.Mode().Type() != fs.ModeSocket {
		return nil, nil, fmt.Errorf("failed to dial device plugin: no unix socket at %s when it registered (a plugin serves, then registers)", path)
	}
	conn, err := unixsock.NewClient(path)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to dial device plugin: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	options, err := pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("failed to get device plugin options from %s within %v: %w", path, timeout, err)
	}
	if options == nil {
		options = &pluginapi.DevicePluginOptions{}
	}
	return conn, options, nil
}

// kubeletSocketName is the file name of the kubelet's registration socket.
const kubeletSocketName = "kubelet.sock"
