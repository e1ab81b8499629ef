package kubeletcompat_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The kubelet's device manager only works in the fixed directory
// /var/lib/kubelet/device-plugins. As root, TestMain runs the tests again in
// a private mount namespace (unshare -m) where /var/lib/kubelet, or /var/lib
// when the host has no /var/lib/kubelet, is covered by a tmpfs: that
// directory is then the test's own, and nothing is written on the host's.
// Elsewhere the tests that need the kubelet's manager fail, saying why.
const (
	namespaceEnv    = "KUBELETCOMPAT_NAMESPACE"
	namespaceScript = `set -eu
if [ -e /var/lib/kubelet ]; then top=/var/lib/kubelet; else top=/var/lib; fi
mount -t tmpfs -o mode=0755,size=16m kubeletcompat "$top"
mkdir -p /var/lib/kubelet/device-plugins
exec "$@"
`
)

// noNamespace says why the kubelet's manager cannot run here; empty when
// it can.
var noNamespace string

func TestMain(m *testing.M) {
	switch {
	case os.Getenv(namespaceEnv) != "":
		noNamespace = checkNamespace()
	case os.Geteuid() != 0:
		noNamespace = "the kubelet's device manager needs root (unshare -m, a tmpfs on /var/lib/kubelet)"
	default:
		if out, err := exec.Command("unshare", "-m", "--propagation", "private", "true").CombinedOutput(); err != nil {
			noNamespace = fmt.Sprintf("unshare -m is not permitted here (%v: %s)", err, bytes.TrimSpace(out))
			break
		}
		cmd := exec.Command("unshare", append([]string{"-m", "--propagation", "private",
			"sh", "-c", namespaceScript, "kubeletcompat-ns", os.Args[0]}, os.Args[1:]...)...)
		cmd.Env = append(os.Environ(), namespaceEnv+"=1")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			os.Exit(exit.ExitCode())
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "kubeletcompat: cannot run the tests in a private mount namespace:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// checkNamespace makes sure the kubelet's directory is on a tmpfs.
func checkNamespace() string {
	var fs unix.Statfs_t
	if err := unix.Statfs(pluginapi.DevicePluginPath, &fs); err != nil {
		return err.Error()
	}
	if fs.Type != unix.TMPFS_MAGIC {
		return pluginapi.DevicePluginPath + " is not on the tmpfs of the test's mount namespace; refusing to touch it"
	}
	return ""
}

// needKubelet fails a test that runs the kubelet's device manager where it
// cannot run, saying why.
func needKubelet(t *testing.T) {
	t.Helper()
	if noNamespace != "" {
		t.Fatal(noNamespace)
	}
}
