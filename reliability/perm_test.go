//go:build reliability

package reliability

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/podresources"
)

// Permissions: Start creates the socket directory (and the checkpoint
// directory, and their missing parents) with mode 0750 minus the umask, the
// checkpoint is written with mode 0600, and kubelet.sock and the
// podresources socket are created with mode 0660 exactly, whatever the umask
// of the process that embeds them: anyone who can connect to kubelet.sock
// can register a device plugin and have pods' containers receive its device
// nodes and mounts, and the podresources socket tells which devices every pod
// holds. Each umask runs in a child process, since the umask is the whole
// process's.

func init() {
	children[rolePermissions] = permissionsChild
}

const (
	rolePermissions = "permissions"
	envPermDir      = "DEVMGR_PERM_DIR"   // an empty directory for the child
	envPermUmask    = "DEVMGR_PERM_UMASK" // octal
)

// The paths the permissions child reports, relative to its directory.
var permPaths = []struct{ name, rel string }{
	{"socket directory", "run/dp"},
	{"socket directory's parent, created too", "run"},
	{"checkpoint directory", "lib/ck"},
	{"checkpoint directory's parent, created too", "lib"},
	{"kubelet.sock", "run/dp/" + devicemanager.KubeletSocketName},
	{"checkpoint", "lib/ck/" + checkpoint.DeviceManagerKey},
	{"podresources socket", "run/pr/" + devicemanager.KubeletSocketName},
}

// permResult maps each name of permPaths to its mode (fs.FileMode bits).
type permResult struct {
	Modes map[string]uint32
}

func TestPermissions(t *testing.T) {
	start := time.Now()
	cases := 0
	seen := map[string]any{}
	for _, mask := range []os.FileMode{0o022, 0o000, 0o077} {
		t.Run(fmt.Sprintf("umask %04o", uint32(mask)), func(t *testing.T) {
			var res permResult
			require.True(t, runRoleChild(t, rolePermissions, []string{
				envPermDir + "=" + shortDir(t),
				envPermUmask + "=" + strconv.FormatUint(uint64(mask), 8),
			}, &res), "the child reported no result")
			mode := func(name string) os.FileMode {
				m, ok := res.Modes[name]
				require.True(t, ok, "no mode for %s", name)
				return os.FileMode(m)
			}
			var shown []string
			for _, p := range permPaths {
				shown = append(shown, fmt.Sprintf("%s %04o", p.name, uint32(mode(p.name).Perm())))
			}
			seen[fmt.Sprintf("umask %04o", uint32(mask))] = strings.Join(shown, ", ")

			for _, name := range []string{permPaths[0].name, permPaths[1].name, permPaths[2].name, permPaths[3].name} {
				cases++
				m := mode(name)
				assert.True(t, m.IsDir(), "%s is not a directory: %v", name, m)
				assert.Equal(t, fmt.Sprintf("%04o", uint32(0o750&^mask)), fmt.Sprintf("%04o", uint32(m.Perm())), "mode of the %s", name)
			}
			cases++
			ck := mode("checkpoint")
			assert.True(t, ck.IsRegular(), "the checkpoint is not a regular file: %v", ck)
			assert.Equal(t, "0600", fmt.Sprintf("%04o", uint32(ck.Perm())), "mode of the checkpoint")
			for _, name := range []string{"kubelet.sock", "podresources socket"} {
				cases++
				sock := mode(name)
				assert.Equal(t, os.ModeSocket, sock.Type(), "the %s is not a socket: %v", name, sock)
				assert.Equal(t, "0660", fmt.Sprintf("%04o", uint32(sock.Perm())), "mode of the %s under umask %04o", name, uint32(mask))
			}
		})
	}
	record(t, Figures{
		Category: "permissions",
		Cases:    cases,
		Details:  seen,
		Elapsed:  time.Since(start).Round(time.Millisecond).String(),
	})
}

// permissionsChild is the permissions role: under the umask it is given, it
// starts a manager whose directories do not exist yet and a podresources
// server on it, admits a pod so that the checkpoint is written, and reports
// the modes.
func permissionsChild() int {
	return runRole(func(t *roleT) any {
		mask, err := strconv.ParseUint(os.Getenv(envPermUmask), 8, 32)
		require.NoError(t, err)
		syscall.Umask(int(mask))
		base := os.Getenv(envPermDir)
		n, err := startDMNode(devicemanager.Options{
			SocketDir:     filepath.Join(base, permPaths[0].rel),
			CheckpointDir: filepath.Join(base, permPaths[2].rel),
			Logger:        klog.Background(),
		}, newActivePods(), 2)
		require.NoError(t, err)
		defer n.stop()
		pr, err := podresources.NewServer(n.m, podresources.PodsFunc(n.pods.list), podresources.Options{Logger: klog.Background()})
		require.NoError(t, err)
		require.NoError(t, pr.Start(filepath.Join(base, permPaths[6].rel)))
		defer func() { assert.NoError(t, pr.Stop()) }()
		_, err = n.admit(nodePod("p", 1))
		require.NoError(t, err)
		res := permResult{Modes: map[string]uint32{}}
		for _, p := range permPaths {
			fi, err := os.Lstat(filepath.Join(base, p.rel))
			require.NoError(t, err)
			res.Modes[p.name] = uint32(fi.Mode())
		}
		return res
	})
}
