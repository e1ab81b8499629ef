// Package unixsock creates unix sockets that have their final mode before
// anyone can connect to them.
//
// bind(2) gives a new socket file the mode of the socket itself minus the
// umask, and the umask belongs to the whole process. net.Listen leaves the
// socket's own mode at 0777, so the file starts as wide as the umask allows
// and already accepts connections; a chmod afterwards leaves a window in
// which whoever the umask let in can connect (and keep the connection), and
// chmod by path follows whatever is at the path then.
//
// Listen instead sets the socket's own mode before bind, so that the file is
// born no wider than asked; if the umask took bits away, it gives them back
// through a descriptor of the file itself (never following a symbolic link);
// and only then does the socket listen. Until listen(2), a connection is
// refused. Nothing changes the process's umask or ties up a thread.
package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Listen listens on the unix socket path, created with the permission bits
// mode (and no others). It fails, as net.Listen does, if something exists at
// path. Closing the listener removes the file, as with net.Listen; callers
// that remove it themselves use SetUnlinkOnClose(false).
func Listen(path string, mode fs.FileMode) (*net.UnixListener, error) {
	if mode&^fs.ModePerm != 0 {
		return nil, fmt.Errorf("listen on %s: mode %v is not a set of permission bits", path, mode)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, opError("socket", path, err)
	}
	sock := os.NewFile(uintptr(fd), path)
	defer sock.Close() // net.FileListener works on its own copy
	if err := unix.Fchmod(fd, uint32(mode)); err != nil {
		return nil, opError("fchmod", path, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return nil, opError("bind", path, err)
	}
	lis, err := listen(sock, path, mode)
	if err != nil && !errors.Is(err, errReplaced) {
		// The file is the one bind just created; nobody could connect yet.
		_ = os.Remove(path)
	}
	return lis, err
}

// errReplaced: something else is at the path bind created the socket at.
var errReplaced = errors.New("the socket file was replaced")

// listen gives the bound socket file exactly mode, then listens.
func listen(sock *os.File, path string, mode fs.FileMode) (*net.UnixListener, error) {
	if err := setMode(path, mode); err != nil {
		return nil, err
	}
	if err := unix.Listen(int(sock.Fd()), unix.SOMAXCONN); err != nil {
		return nil, opError("listen", path, err)
	}
	l, err := net.FileListener(sock)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	lis, ok := l.(*net.UnixListener)
	if !ok {
		_ = l.Close()
		return nil, fmt.Errorf("listen on %s: not a unix listener: %T", path, l)
	}
	lis.SetUnlinkOnClose(true)
	return lis, nil
}

// setMode gives the socket file at path exactly mode, through a descriptor
// opened without following a symbolic link, when the umask took bits away.
func setMode(path string, mode fs.FileMode) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return opError("open", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return opError("stat", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("listen on %s: %w", path, errReplaced)
	}
	if fs.FileMode(st.Mode)&fs.ModePerm == mode {
		return nil
	}
	// chmod(2) of an O_PATH descriptor's /proc entry changes the file the
	// descriptor holds, whatever is at path by now.
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), uint32(mode)); err != nil {
		return opError("chmod", path, err)
	}
	return nil
}

func opError(op, path string, err error) error {
	return fmt.Errorf("listen on %s: %w", path, &fs.PathError{Op: op, Path: path, Err: err})
}
