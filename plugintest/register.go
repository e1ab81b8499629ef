package plugintest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	regapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// RegisterTimeout bounds Register: dialling kubelet.sock and the Register
// call. It is the kubelet's own dial timeout.
const RegisterTimeout = 10 * time.Second

// RegisterRequest returns the request Register sends: version v1beta1, the
// bare Endpoint file name, the resource name and the registration options.
// It is a new message each time; change it and pass it to RegisterWith to
// send a malformed registration.
func (p *Plugin) RegisterRequest() *pluginapi.RegisterRequest {
	return &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.endpoint,
		ResourceName: p.resource,
		Options:      proto.CloneOf(p.regOptions),
	}
}

// Register registers the plugin with the kubelet (or devmgr) listening on
// the unix socket kubeletSocket, sending RegisterRequest. Like the kubelet's
// own blocking dial, it waits for the socket to accept a connection, up to
// RegisterTimeout for the whole call; Stop ends it early. The plugin should
// be serving (Start) first, since the kubelet dials back during the call.
// Calling it again re-registers.
//
// Once it has succeeded, unless Options.NoReregister, the Plugin registers
// again by itself each time kubeletSocket is created anew, until
// Stop: it serves its socket again first if it is gone, since a starting
// kubelet removes the sockets in its directory. It leaves the socket to a
// newer Plugin started on the same path, which follows the kubelet in its
// place. A failed re-registration is logged; the next creation tries again.
func (p *Plugin) Register(kubeletSocket string) error {
	path, err := filepath.Abs(kubeletSocket)
	if err != nil {
		return fmt.Errorf("plugintest: register: %w", err)
	}
	ctx, cancel := context.WithTimeout(p.stopCtx, RegisterTimeout)
	defer cancel()
	if err := p.RegisterWith(ctx, kubeletSocket, p.RegisterRequest()); err != nil {
		return err
	}
	return p.follow(path)
}

// RegisterWith sends req, as given, to the Registration service on the unix
// socket kubeletSocket; ctx bounds the dial and the call. The returned error
// wraps the gRPC status error, so status.Code works on it. Unlike Register,
// it does not make the Plugin register again when kubeletSocket is
// re-created.
func (p *Plugin) RegisterWith(ctx context.Context, kubeletSocket string, req *pluginapi.RegisterRequest) error {
	path, err := filepath.Abs(kubeletSocket)
	if err != nil {
		return fmt.Errorf("plugintest: register: %w", err)
	}
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("plugintest: register: %w", err)
	}
	defer conn.Close()
	// WaitForReady: wait for the dial (within ctx) rather than fail at the
	// first refused connection, as the kubelet's blocking dial does.
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, req, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("plugintest: register %q at %s: %w", req.GetResourceName(), kubeletSocket, err)
	}
	p.logger.V(2).Info("Registered", "socketPath", kubeletSocket, "endpoint", req.GetEndpoint())
	return nil
}

// ServeRegistry serves the pluginregistration v1 Registration service (the
// kubelet's plugin-watcher path) on a socket in dir named after Endpoint,
// without ".sock", plus "-reg.sock" ("example.com-gpu-reg.sock"). GetInfo
// answers PluginInfo, and NotifyRegistrationStatus is recorded (see
// WaitForRegistrationStatus). It needs Start first; Stop or StopRegistry
// ends it. dir must be absolute and differ from SocketDir in practice, as
// the kubelet's registry directory does.
func (p *Plugin) ServeRegistry(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("plugintest: registry dir %q is not absolute", dir)
	}
	path := filepath.Join(dir, strings.TrimSuffix(p.endpoint, ".sock")+"-reg.sock")
	if len(path) > maxSocketPathLen {
		return fmt.Errorf("plugintest: socket path %q is longer than %d bytes", path, maxSocketPathLen)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.stopped:
		return ErrStopped
	case !p.started:
		return ErrNotStarted
	case p.registry != nil:
		return fmt.Errorf("plugintest: registry already serving on %s", p.regSocket.path)
	}
	lis, sock, err := listenUnix(path)
	if err != nil {
		return err
	}
	p.registry = grpc.NewServer(grpc.WaitForHandlers(true))
	regapi.RegisterRegistrationServer(p.registry, &registryService{p: p})
	p.regSocket = sock
	p.serveLocked(p.registry, lis)
	p.logger.V(2).Info("Registry serving", "socketPath", path)
	return nil
}

// RegistrySocketPath returns the socket ServeRegistry serves on, or "" when
// the registry is not serving.
func (p *Plugin) RegistrySocketPath() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.regSocket == nil {
		return ""
	}
	return p.regSocket.path
}

// StopRegistry stops the registry server and removes its socket, as a plugin
// that deregisters from the plugin watcher; the device plugin keeps serving.
// A no-op when the registry is not serving.
func (p *Plugin) StopRegistry() {
	p.mu.Lock()
	s, sock := p.registry, p.regSocket
	p.registry, p.regSocket = nil, nil
	p.mu.Unlock()
	if s == nil {
		return
	}
	s.Stop()
	sock.remove(p.logger)
}

// PluginInfo returns what GetInfo answers: the override given to
// SetPluginInfo, or by default Type "DevicePlugin", Name the resource name,
// Endpoint SocketPath and SupportedVersions ["v1beta1"].
func (p *Plugin) PluginInfo() *regapi.PluginInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.info != nil {
		return proto.CloneOf(p.info)
	}
	return &regapi.PluginInfo{
		Type:              regapi.DevicePlugin,
		Name:              p.resource,
		Endpoint:          p.socketPath,
		SupportedVersions: []string{pluginapi.Version},
	}
}

// SetPluginInfo makes GetInfo answer a copy of info, which may be malformed;
// nil restores the default.
func (p *Plugin) SetPluginInfo(info *regapi.PluginInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.info = proto.CloneOf(info)
}

// WaitForRegistrationStatus returns the latest status the plugin watcher
// sent with NotifyRegistrationStatus, waiting for the first one until ctx
// ends. To wait for a later one, use WaitForCalls with
// MethodNotifyRegistrationStatus.
func (p *Plugin) WaitForRegistrationStatus(ctx context.Context) (*regapi.RegistrationStatus, error) {
	calls, err := p.WaitForCalls(ctx, MethodNotifyRegistrationStatus, 1)
	if err != nil {
		return nil, err
	}
	st, ok := calls[len(calls)-1].Request.(*regapi.RegistrationStatus)
	if !ok {
		return nil, errors.New("plugintest: recorded NotifyRegistrationStatus request has an unexpected type")
	}
	return st, nil
}

// registryService serves the pluginregistration Registration service.
type registryService struct {
	regapi.UnimplementedRegistrationServer
	p *Plugin
}

func (s *registryService) GetInfo(ctx context.Context, req *regapi.InfoRequest) (*regapi.PluginInfo, error) {
	if err := s.p.enter(ctx, MethodGetInfo, req); err != nil {
		return nil, err
	}
	return s.p.PluginInfo(), nil
}

func (s *registryService) NotifyRegistrationStatus(ctx context.Context, req *regapi.RegistrationStatus) (*regapi.RegistrationStatusResponse, error) {
	if err := s.p.enter(ctx, MethodNotifyRegistrationStatus, req); err != nil {
		return nil, err
	}
	if !req.GetPluginRegistered() {
		s.p.logger.V(2).Info("Registration failed", "reason", req.GetError())
	}
	return &regapi.RegistrationStatusResponse{}, nil
}
