package blackbox_test

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/devicemanager"
)

// dirEntry is what a test compares to tell that a file was left alone.
type dirEntry struct {
	mode    fs.FileMode
	size    int64
	mtime   int64
	ino     uint64
	content string
}

// snapshot records every entry of dir (not recursing).
func snapshot(t *testing.T, dir string) map[string]dirEntry {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string]dirEntry{}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		require.NoError(t, err)
		d := dirEntry{mode: fi.Mode(), size: fi.Size(), mtime: fi.ModTime().UnixNano(), ino: fi.Sys().(*syscall.Stat_t).Ino}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			d.content = string(b)
		}
		out[e.Name()] = d
	}
	return out
}

// fillSocketDir puts in dir what Start would otherwise remove or move: a
// plugin's stale socket, a temporary file of an interrupted checkpoint
// write, a corrupt checkpoint; and a regular file Start never touches.
func fillSocketDir(t *testing.T, dir string) {
	t.Helper()
	makeStaleSocket(t, filepath.Join(dir, "old-plugin.sock"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".123456"), []byte("half a write"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, checkpoint.DeviceManagerKey), []byte("{corrupt"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "DEPRECATION"), []byte("x"), 0o600))
}

// accepts reports whether a connection to the unix socket path succeeds.
func accepts(path string) bool {
	c, err := net.Dial("unix", path)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// A running kubelet (anything accepting on kubelet.sock) is never taken
// over: Start fails with ErrSocketInUse, naming the socket, and leaves every
// file in the directory as it was.
func TestStartRefusesALiveKubeletSocket(t *testing.T) {
	e := newEnv(t, nil)
	kubeletSock := filepath.Join(e.dir, devicemanager.KubeletSocketName)
	kubelet, err := net.Listen("unix", kubeletSock)
	require.NoError(t, err)
	defer kubelet.Close()
	fillSocketDir(t, e.dir)
	before := snapshot(t, e.dir)

	m, err := devicemanager.NewManagerImpl(e.opts)
	require.NoError(t, err)
	err = m.Start(e.pods.get, e.ready, nil, nil)
	require.ErrorIs(t, err, devicemanager.ErrSocketInUse)
	assert.ErrorContains(t, err, kubeletSock+" accepts connections")
	assert.ErrorContains(t, err, "stop it or choose another socket directory")
	assert.Equal(t, before, snapshot(t, e.dir), "Start changed the directory of a running kubelet")
	assert.True(t, accepts(kubeletSock), "the kubelet's socket still serves")
	assert.Error(t, m.HealthCheck(), "the manager did not start")
	require.NoError(t, m.Stop())
	assert.Equal(t, before, snapshot(t, e.dir), "Stop of a manager that never started touched the directory")
}

// One manager per directory: a second one fails with ErrSocketInUse while
// the first runs, also when kubelet.sock itself is gone (the directory's
// lock refuses it), and starts once the first has stopped.
func TestSecondManagerOnOneDirectory(t *testing.T) {
	e := newEnv(t, nil)
	first := e.start(t)
	kubeletSock := filepath.Join(e.dir, devicemanager.KubeletSocketName)

	second, err := devicemanager.NewManagerImpl(e.opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = second.Stop() })
	err = second.Start(e.pods.get, e.ready, nil, nil)
	require.ErrorIs(t, err, devicemanager.ErrSocketInUse)
	assert.ErrorContains(t, err, "another device manager holds "+e.dir)

	// Without kubelet.sock only the lock tells: nothing must be touched.
	require.NoError(t, os.Remove(kubeletSock))
	fillSocketDir(t, e.dir)
	before := snapshot(t, e.dir)
	err = second.Start(e.pods.get, e.ready, nil, nil)
	require.ErrorIs(t, err, devicemanager.ErrSocketInUse)
	assert.Equal(t, before, snapshot(t, e.dir), "the refused manager changed the directory")

	require.NoError(t, first.Stop())
	require.NoError(t, second.Start(e.pods.get, e.ready, nil, nil), "the directory is free once the first manager stopped")
	assert.True(t, accepts(kubeletSock))
	assert.NoFileExists(t, filepath.Join(e.dir, "old-plugin.sock"), "the owner removes stale sockets")
	p := newFakePlugin(t, e.dir, "p.sock", resGPU, nil, healthy("d0"))
	p.start(t)
	require.NoError(t, registerPlugin(t, e.dir, p))
	e.mgr = second
	e.waitCapacity(t, resGPU, 1, 1)
}

// A kubelet.sock nothing listens on (a crashed kubelet or manager left it)
// is stale: Start replaces it.
func TestStartReplacesAStaleKubeletSocket(t *testing.T) {
	e := newEnv(t, nil)
	kubeletSock := filepath.Join(e.dir, devicemanager.KubeletSocketName)
	makeStaleSocket(t, kubeletSock)
	require.False(t, accepts(kubeletSock))

	e.start(t)
	assert.True(t, accepts(kubeletSock), "kubelet.sock is the manager's")
}

// Stop removes kubelet.sock only if it is still the socket Start created.
func TestStopLeavesAnotherKubeletSocket(t *testing.T) {
	e := newEnv(t, nil)
	m := e.start(t)
	kubeletSock := filepath.Join(e.dir, devicemanager.KubeletSocketName)
	require.NoError(t, os.Remove(kubeletSock))
	other, err := net.Listen("unix", kubeletSock)
	require.NoError(t, err)
	defer other.Close()

	require.NoError(t, m.Stop())
	assert.True(t, accepts(kubeletSock), "Stop removed a socket it did not create")
}

// kubelet.sock is created 0660 whatever the umask: no moment at another
// mode, and no chmod afterwards. The umask is the whole process's; no test
// in this package runs in parallel, and this one restores it.
func TestKubeletSocketModeUnderEveryUmask(t *testing.T) {
	for _, mask := range []int{0o000, 0o022, 0o077} {
		t.Run(fmt.Sprintf("umask %04o", mask), func(t *testing.T) {
			old := syscall.Umask(mask)
			defer syscall.Umask(old)
			e := newEnv(t, nil)
			e.start(t)
			fi, err := os.Lstat(filepath.Join(e.dir, devicemanager.KubeletSocketName))
			require.NoError(t, err)
			assert.Equal(t, fs.ModeSocket, fi.Mode().Type())
			assert.Equal(t, "0660", fmt.Sprintf("%04o", uint32(fi.Mode().Perm())))
			assert.Equal(t, mask, syscall.Umask(mask), "Start changed the process's umask")
		})
	}
}

// Two managers with socket directories of their own but one checkpoint
// directory would write one checkpoint: the second is refused, touching
// nothing in the checkpoint directory.
func TestSecondManagerOnOneCheckpointDirectory(t *testing.T) {
	ckpt := tempDir(t)
	e := newEnv(t, func(o *devicemanager.Options) { o.CheckpointDir = ckpt })
	first := e.start(t)
	require.NoError(t, os.WriteFile(filepath.Join(ckpt, ".123456"), []byte("half a write"), 0o600))
	before := snapshot(t, ckpt)

	other := tempDir(t)
	second, err := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: other, CheckpointDir: ckpt})
	require.NoError(t, err)
	t.Cleanup(func() { _ = second.Stop() })
	err = second.Start(nil, nil, nil, nil)
	require.ErrorIs(t, err, devicemanager.ErrSocketInUse)
	assert.ErrorContains(t, err, "another device manager holds "+ckpt)
	assert.Equal(t, before, snapshot(t, ckpt), "the refused manager changed the checkpoint directory")
	assert.NoFileExists(t, filepath.Join(other, devicemanager.KubeletSocketName), "the refused manager does not listen")

	require.NoError(t, first.Stop())
	require.NoError(t, second.Start(nil, nil, nil, nil), "the directory is free once the first manager stopped")
}
