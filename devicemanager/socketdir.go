package devicemanager

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/opencontainers/selinux/go-selinux"
	"golang.org/x/sys/unix"

	"github.com/openkubelet/devmgr/internal/unixsock"
)

const (
	// kubeletSocketMode lets the owner and group connect to kubelet.sock:
	// device plugins run as root or in the manager's group, and whoever can
	// connect can register a plugin and so put device nodes and mounts into
	// pods' containers. Nobody else may.
	kubeletSocketMode = 0o660
	// pluginDirLabel is the SELinux label the kubelet gives its device
	// plugin directory, so that plugins in unprivileged containers can
	// create and reach sockets there.
	pluginDirLabel = "system_u:object_r:container_file_t:s0"
	// probeTimeout bounds the dial that tells a live kubelet.sock from a
	// stale one.
	probeTimeout = time.Second
)

// The SELinux calls Start makes; tests replace them, since SELinux is
// seldom enabled where tests run.
var (
	selinuxEnabled = selinux.GetEnabled
	setFileLabel   = selinux.SetFileLabel
)

// dirLocks are the flocks a manager holds on its directories.
type dirLocks []*os.File

// lockDirs takes an exclusive flock, without waiting, on each directory
// itself (once when two name the same one), so that no file appears in them
// for the lock: SocketDir, where the kubelet keeps its sockets, and
// CheckpointDir, where two managers would write one checkpoint. The locks are
// held until release (or the process exits).
func lockDirs(dirs ...string) (dirLocks, error) {
	var locks dirLocks
	var seen []fs.FileInfo
	for _, dir := range dirs {
		fi, err := os.Stat(dir)
		if err != nil {
			locks.release()
			return nil, fmt.Errorf("lock directory: %w", err)
		}
		if slices.ContainsFunc(seen, func(o fs.FileInfo) bool { return os.SameFile(o, fi) }) {
			continue
		}
		seen = append(seen, fi)
		f, err := lockDir(dir)
		if err != nil {
			locks.release()
			return nil, err
		}
		locks = append(locks, f)
	}
	return locks, nil
}

func lockDir(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("lock directory: %w", &fs.PathError{Op: "open", Path: dir, Err: err})
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: another device manager holds %s (it has the directory locked); stop it or choose another directory",
				ErrSocketInUse, dir)
		}
		return nil, fmt.Errorf("lock directory: %w", &fs.PathError{Op: "flock", Path: dir, Err: err})
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// release drops the locks.
func (l dirLocks) release() {
	for _, f := range l {
		_ = f.Close()
	}
}

// checkKubeletSocket fails with ErrSocketInUse if something accepts
// connections on kubelet.sock. A refused connection means a socket whose
// server is gone (stale), or no socket at all; anything else is an error,
// since it cannot tell a live socket from a stale one.
func (m *ManagerImpl) checkKubeletSocket() error {
	conn, err := net.DialTimeout("unix", m.kubeletSocket(), probeTimeout)
	switch {
	case err == nil:
		_ = conn.Close()
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, fs.ErrNotExist):
		return nil
	case !errors.Is(err, syscall.EAGAIN): // EAGAIN: its backlog is full
		return fmt.Errorf("cannot tell whether %s is in use: %w", m.kubeletSocket(), err)
	}
	return fmt.Errorf("%w: %s accepts connections: a kubelet or another device manager serves it; stop it or choose another socket directory",
		ErrSocketInUse, m.kubeletSocket())
}

// labelSocketDir gives SocketDir the kubelet's SELinux label when SELinux is
// enabled. Failing to is logged, not fatal, as in the kubelet: only plugins
// in confined containers need the label.
func (m *ManagerImpl) labelSocketDir() {
	if !selinuxEnabled() {
		return
	}
	if err := setFileLabel(m.opts.SocketDir, pluginDirLabel); err != nil {
		m.log.Error(err, "Cannot set the SELinux label of the socket directory; device plugins in unprivileged containers may be unable to register",
			keyPath, m.opts.SocketDir, keyLabel, pluginDirLabel)
	}
}

// removeStaleSockets removes every unix socket in SocketDir. Regular files,
// directories and symbolic links are left alone.
func (m *ManagerImpl) removeStaleSockets() error {
	entries, err := os.ReadDir(m.opts.SocketDir)
	if err != nil {
		return fmt.Errorf("list socket directory: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if e.Type() != os.ModeSocket {
			continue
		}
		p := filepath.Join(m.opts.SocketDir, e.Name())
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		m.log.V(2).Info("Removed stale socket", keyPath, p)
	}
	return errors.Join(errs...)
}

// listenKubeletSocket listens on kubelet.sock, created with its final mode.
// The file is not removed when the listener closes: removeKubeletSocket
// removes it if it is still this one.
func (m *ManagerImpl) listenKubeletSocket() (*net.UnixListener, fs.FileInfo, error) {
	lis, err := unixsock.Listen(m.kubeletSocket(), kubeletSocketMode)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to listen to socket while starting device plugin registry: %w", err)
	}
	lis.SetUnlinkOnClose(false)
	fi, err := os.Lstat(m.kubeletSocket())
	if err != nil {
		_ = lis.Close()
		return nil, nil, fmt.Errorf("failed to listen to socket while starting device plugin registry: %w", err)
	}
	return lis, fi, nil
}

// removeKubeletSocket removes kubelet.sock if it is still the file whose
// identity is mine; another's socket at that path is left alone. Call it
// before closing the listener: while it is open, the file's inode cannot be
// reused.
func (m *ManagerImpl) removeKubeletSocket(mine fs.FileInfo) {
	fi, err := os.Lstat(m.kubeletSocket())
	if err == nil && os.SameFile(fi, mine) {
		err = os.Remove(m.kubeletSocket())
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.log.Error(err, "Failed to remove registration socket", keyPath, m.kubeletSocket())
	}
}
