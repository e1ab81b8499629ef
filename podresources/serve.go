package podresources

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"

	"github.com/openkubelet/devmgr/internal/unixsock"
)

var (
	// ErrStarted is returned by Start when the server is already serving.
	ErrStarted = errors.New("podresources: server already started")
	// ErrStopped is returned by Start once Stop has been called: a stopped
	// Server cannot be started again.
	ErrStopped = errors.New("podresources: server stopped")
	// ErrNotSocket is returned by Start when its path exists and is not a
	// unix socket; Start never removes such a file.
	ErrNotSocket = errors.New("podresources: path exists and is not a socket")
	// ErrSocketInUse is returned by Start when something accepts connections
	// on its path: the socket of a running kubelet or another server is
	// never taken over.
	ErrSocketInUse = errors.New("podresources: socket in use")
)

const (
	// maxSocketPath is the longest unix socket path Linux accepts (sun_path
	// holds 108 bytes including the terminating NUL).
	maxSocketPath = 107
	// probeTimeout bounds the dial that tells a live socket from a stale one.
	probeTimeout = time.Second
	// socketMode lets the owner and group connect: the API tells which
	// devices every pod on the node holds, for node agents (monitoring
	// exporters, device plugins) that run as root or in the server's group;
	// nobody else needs it.
	socketMode = 0o660
)

// Start serves the API on the unix socket socketPath, in a goroutine, with
// the message size limits of Options. It creates the socket's directory
// (0750) if missing and replaces a stale socket left there; a path that is
// not a socket, or a socket in use, is an error. The socket is created with
// mode 0660 whatever the umask. Start returns once the socket accepts
// connections.
func (s *Server) Start(socketPath string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped:
		return ErrStopped
	case s.started:
		return ErrStarted
	}
	sock, err := listenOwned(socketPath)
	if err != nil {
		return err
	}
	g := grpc.NewServer(
		grpc.MaxRecvMsgSize(s.opts.MaxRecvMsgSize),
		grpc.MaxSendMsgSize(s.opts.MaxSendMsgSize),
		// Stop returns only once every handler has.
		grpc.WaitForHandlers(true),
	)
	s.Register(g)
	s.started, s.grpc, s.sock = true, g, sock
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// Serve returns nil after Stop; anything else means it failed.
		if err := g.Serve(sock.listener); err != nil {
			s.log.Error(err, "Podresources server stopped serving", keySocket, sock.path)
		}
	}()
	s.log.V(2).Info("Serving the podresources API", keySocket, sock.path)
	return nil
}

// Stop removes the socket if the file at its path is still the one Start
// created (never anything else), closes every connection, and waits for the
// calls in progress and the serving goroutine. It is idempotent and safe
// before Start.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	if !s.started {
		return nil
	}
	// Removed while the listener still holds the file, so that its inode
	// cannot have been reused by another's socket.
	rmErr := s.sock.remove()
	s.grpc.Stop()
	s.wg.Wait()
	if rmErr != nil {
		return fmt.Errorf("podresources: remove socket %s: %w", s.sock.path, rmErr)
	}
	s.log.V(2).Info("Stopped serving the podresources API", keySocket, s.sock.path)
	return nil
}

// SocketPath returns the path Start listens on; "" before Start.
func (s *Server) SocketPath() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sock == nil {
		return ""
	}
	return s.sock.path
}

// ownedSocket is a unix listener whose file is removed at the end only if it
// is still the file the listener created.
type ownedSocket struct {
	listener net.Listener
	path     string
	info     fs.FileInfo
}

// listenOwned listens on the unix socket path after making room for it.
func listenOwned(path string) (*ownedSocket, error) {
	if path == "" {
		return nil, errors.New("podresources: socket path must not be empty")
	}
	if n := len(path); n > maxSocketPath {
		return nil, fmt.Errorf("podresources: socket path %s is %d bytes long; a unix socket path holds at most %d", path, n, maxSocketPath)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("podresources: create socket directory: %w", err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	l, err := unixsock.Listen(path, socketMode)
	if err != nil {
		return nil, fmt.Errorf("podresources: listen: %w", err)
	}
	// remove deletes the file, after checking it is still this one.
	l.SetUnlinkOnClose(false)
	fi, err := os.Lstat(path)
	if err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("podresources: listen: %w", err)
	}
	return &ownedSocket{listener: l, path: path, info: fi}, nil
}

// removeStale removes a socket nothing serves on at path. Nothing at path
// is fine; anything other than a socket, or a live socket, is an error.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("podresources: %w", err)
	case fi.Mode().Type() != fs.ModeSocket:
		return fmt.Errorf("%w: %s", ErrNotSocket, path)
	}
	if conn, err := net.DialTimeout("unix", path, probeTimeout); err == nil {
		_ = conn.Close()
		return fmt.Errorf("%w: %s", ErrSocketInUse, path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("podresources: remove stale socket: %w", err)
	}
	return nil
}

// remove deletes the socket file if it is still the one listenOwned created.
func (o *ownedSocket) remove() error {
	fi, err := os.Lstat(o.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !os.SameFile(fi, o.info):
		return nil // replaced by someone else's file
	}
	if err := os.Remove(o.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
