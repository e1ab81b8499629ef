package unixsock_test

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openkubelet/devmgr/internal/unixsock"
)

// The umask is the whole process's: no test in this package runs in
// parallel, and each restores the umask it found.
func setUmask(t *testing.T, mask int) {
	old := syscall.Umask(mask)
	t.Cleanup(func() { syscall.Umask(old) })
}

// currentUmask reads the process's umask (the calling thread's, which the
// other threads share).
func currentUmask() int {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return m
}

func shortDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "us")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func perm(t *testing.T, path string) fs.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	require.NoError(t, err)
	require.Equal(t, fs.ModeSocket, fi.Mode().Type(), "%s is not a socket", path)
	return fi.Mode() & fs.ModePerm
}

func TestListenCreatesTheExactMode(t *testing.T) {
	for _, mask := range []int{0o000, 0o022, 0o077} {
		for _, mode := range []fs.FileMode{0o600, 0o660, 0o666, 0o700, 0o000} {
			t.Run(fmt.Sprintf("umask %04o mode %04o", mask, mode), func(t *testing.T) {
				setUmask(t, mask)
				path := filepath.Join(shortDir(t), "s.sock")
				lis, err := unixsock.Listen(path, mode)
				require.NoError(t, err)
				defer lis.Close()
				assert.Equal(t, mode, perm(t, path))
				assert.Equal(t, mask, currentUmask(), "the process's umask is unchanged")
			})
		}
	}
}

func TestListenServes(t *testing.T) {
	path := filepath.Join(shortDir(t), "s.sock")
	lis, err := unixsock.Listen(path, 0o600)
	require.NoError(t, err)
	accepted := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err == nil {
			err = c.Close()
		}
		accepted <- err
	}()
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.NoError(t, <-accepted)
	require.NoError(t, lis.Close())
	assert.NoFileExists(t, path, "closing the listener removes its socket, as net.Listen's does")
}

// Listen never changes the process's umask: files created afterwards, from
// any goroutine (and so any thread), get it.
func TestListenLeavesTheProcessUmask(t *testing.T) {
	setUmask(t, 0o022)
	dir := shortDir(t)
	for i := range 20 {
		lis, err := unixsock.Listen(filepath.Join(dir, fmt.Sprintf("%d.sock", i)), 0o000)
		require.NoError(t, err)
		require.NoError(t, lis.Close())
	}
	assert.Equal(t, 0o022, currentUmask())

	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Go(func() {
			p := filepath.Join(dir, fmt.Sprintf("f%d", i))
			if err := os.WriteFile(p, nil, 0o666); err != nil {
				errs <- err
				return
			}
			fi, err := os.Stat(p)
			if err == nil && fi.Mode().Perm() != 0o644 {
				err = fmt.Errorf("%s has mode %04o, want 0644", p, fi.Mode().Perm())
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
}

func TestListenErrors(t *testing.T) {
	setUmask(t, 0o022)
	dir := shortDir(t)
	taken := filepath.Join(dir, "taken")
	require.NoError(t, os.WriteFile(taken, []byte("keep"), 0o600))

	_, err := unixsock.Listen(taken, 0o600)
	require.Error(t, err, "something exists at the path")
	assert.ErrorIs(t, err, syscall.EADDRINUSE)
	got, rerr := os.ReadFile(taken)
	require.NoError(t, rerr)
	assert.Equal(t, "keep", string(got), "the file in the way is left alone")

	_, err = unixsock.Listen(filepath.Join(dir, "missing", "s.sock"), 0o600)
	assert.ErrorIs(t, err, syscall.ENOENT)

	_, err = unixsock.Listen(filepath.Join(dir, "s.sock"), 0o600|fs.ModeSetuid)
	assert.ErrorContains(t, err, "is not a set of permission bits")
	assert.NoFileExists(t, filepath.Join(dir, "s.sock"))

	assert.Equal(t, 0o022, currentUmask(), "no error path changes the process's umask")
}
