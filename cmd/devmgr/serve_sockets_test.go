package main

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
)

// serve's three sockets are created with their modes whatever the umask it
// runs under: kubelet.sock and the podresources socket 0660, the control
// socket 0600. The umask is the whole process's and serve inherits it: no
// test in this package runs in parallel, and this one restores it once
// serve is started.
func TestServeSocketModesUnderEveryUmask(t *testing.T) {
	for _, mask := range []int{0o000, 0o022, 0o077} {
		t.Run(fmt.Sprintf("umask %04o", mask), func(t *testing.T) {
			dir := shortTempDir(t)
			ctl := filepath.Join(dir, "ctl.sock")
			kubeletSock := filepath.Join(dir, "dp", "kubelet.sock")
			prSock := filepath.Join(dir, "pr", "kubelet.sock")
			old := syscall.Umask(mask)
			p := launchServe(t, ctl, "--socket-dir", filepath.Dir(kubeletSock), "--podresources-socket", prSock)
			syscall.Umask(old)
			p.waitReady()
			for path, want := range map[string]fs.FileMode{kubeletSock: 0o660, prSock: 0o660, ctl: 0o600} {
				fi, err := os.Lstat(path)
				require.NoError(t, err)
				assert.Equal(t, fs.ModeSocket, fi.Mode().Type(), path)
				assert.Equal(t, fmt.Sprintf("%04o", uint32(want)), fmt.Sprintf("%04o", uint32(fi.Mode().Perm())), path)
			}
			require.Equal(t, 0, p.stop(syscall.SIGTERM))
		})
	}
}

// serve never takes over a running kubelet's directory: it fails, says why,
// and leaves the kubelet's socket and the plugins' sockets alone.
func TestServeRefusesARunningKubeletsDirectory(t *testing.T) {
	dir := shortTempDir(t)
	sockDir := filepath.Join(dir, "dp")
	require.NoError(t, os.Mkdir(sockDir, 0o750))
	kubeletSock := filepath.Join(sockDir, "kubelet.sock")
	kubelet, err := net.Listen("unix", kubeletSock)
	require.NoError(t, err)
	defer kubelet.Close()
	plugin := filepath.Join(sockDir, "plugin.sock")
	staleSocket(t, plugin)

	ctl := filepath.Join(dir, "ctl.sock")
	fails(t, nil, []string{"serve", "--socket-dir", sockDir, "--control-socket", ctl},
		"start device manager: device plugin socket directory in use: "+kubeletSock+" accepts connections",
		"stop it or choose another socket directory")
	assert.True(t, exists(plugin), "a plugin's socket was removed")
	c, err := net.Dial("unix", kubeletSock)
	require.NoError(t, err, "the kubelet's socket no longer serves")
	require.NoError(t, c.Close())
	assert.False(t, exists(ctl), "a serve that did not start has no control socket")
}
