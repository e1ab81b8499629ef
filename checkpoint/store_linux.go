package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// openSpare opens or creates the spare name, refusing a symbolic link
// (and, not blocking on a FIFO or device, anything but a regular file), and
// fails unless it is usable (see usableSpare) and open nowhere else.
//
// Open nowhere else: the spare was the checkpoint until the last write, and
// a reader that opened it then (a backup, `devmgr checkpoint verify`) must
// not see it rewritten under it; nor may another store write it at the same
// time. Linux grants a write lease only on a file that no other descriptor
// has open, in any process: taking one and dropping it at once is that test.
// Until the spare has taken the checkpoint's place, nothing but another
// store opens it (by its own name), and that store's test fails while this
// one keeps it open.
func openSpare(name string) (tempFile, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0o600)
	if err != nil {
		return nil, err
	}
	info, err := f.Stat()
	if err == nil && !usableSpare(info) {
		err = fmt.Errorf("%s is not a usable spare (mode %s, links %d)", name, info.Mode(), links(info))
	}
	if err == nil {
		err = openElsewhere(f)
	}
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return osFile{f}, nil
}

// openElsewhere returns an error when f's file is open through another
// descriptor (or the test cannot be made: leases disabled, a file system
// without them).
func openElsewhere(f *os.File) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var leaseErr error
	if err := raw.Control(func(fd uintptr) {
		if _, leaseErr = unix.FcntlInt(fd, unix.F_SETLEASE, unix.F_WRLCK); leaseErr == nil {
			_, leaseErr = unix.FcntlInt(fd, unix.F_SETLEASE, unix.F_UNLCK)
		}
	}); err != nil {
		return err
	}
	if leaseErr != nil {
		return fmt.Errorf("%s may be open elsewhere: write lease: %w", f.Name(), leaseErr)
	}
	return nil
}

// usableSpare reports whether info is a regular file of mode 0600 with one
// link: one that becomes the checkpoint unchanged and that no other name
// shares.
func usableSpare(info fs.FileInfo) bool {
	return info.Mode().IsRegular() && info.Mode().Perm() == 0o600 && links(info) == 1
}

// links returns info's link count, or 0 when the system does not say.
func links(info fs.FileInfo) uint64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 0
}

// exchange swaps the files at a and b in one step (renameat2 with
// RENAME_EXCHANGE, Linux 3.15 and later; ext4, xfs, btrfs and tmpfs have it).
func exchange(a, b string) error {
	if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
		return &os.LinkError{Op: "exchange", Old: a, New: b, Err: err}
	}
	return nil
}

// datasync flushes f's content and the metadata needed to read it back.
func datasync(f *os.File) error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
		}
		return nil
	}
}

// identity is the fileID of a file whose info came from Stat.
func identity(info fs.FileInfo) fileID {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ok: true} //nolint:unconvert // Dev is not uint64 everywhere
}
