// Package unixsock creates unix sockets that have their final mode from the
// moment they appear on the file system.
//
// bind(2) gives a new socket file the mode 0777 minus the umask, and the
// umask belongs to the whole process. Changing the mode afterwards leaves a
// window in which whoever the umask let in can connect (and keep the
// connection), and chmod by path follows whatever is at the path then.
// Listen instead binds on an operating-system thread of its own whose file
// system attributes (umask, working directory, root) are unshared from the
// rest of the process, with the umask that yields exactly the mode asked
// for. The thread is discarded afterwards, so nothing else ever runs with
// that umask.
package unixsock

import (
	"fmt"
	"io/fs"
	"net"
	"runtime"

	"golang.org/x/sys/unix"
)

// Listen listens on the unix socket path, created with the permission bits
// mode (and no others). It fails, as net.Listen does, if something exists at
// path, and also where a seccomp filter forbids unshare(2) (for example one
// that allows it only with CAP_SYS_ADMIN). The umask of the rest of the
// process is never changed.
func Listen(path string, mode fs.FileMode) (*net.UnixListener, error) {
	if mode&^fs.ModePerm != 0 {
		return nil, fmt.Errorf("listen on %s: mode %v is not a set of permission bits", path, mode)
	}
	type result struct {
		lis *net.UnixListener
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Never unlocked: the thread, with its own umask, ends with this
		// goroutine instead of going back to the scheduler.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			done <- result{err: fmt.Errorf("listen on %s: give the thread its own umask: %w", path, err)}
			return
		}
		unix.Umask(int(^mode & fs.ModePerm))
		lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		done <- result{lis, err}
	}()
	r := <-done
	return r.lis, r.err
}
