//go:build reliability

package reliability

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
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

// The paths the permissions child reports, relative to its directory, with
// their type and mode. Directories Start creates have no mode of their own:
// they get 0750 minus the umask, as MkdirAll gives them. The checkpoint and
// the sockets have theirs whatever the umask.
var permPaths = []struct {
	name, rel string
	typ       fs.FileMode
	mode      fs.FileMode // 0: 0750 minus the umask
}{
	{"socket directory", "run/dp", fs.ModeDir, 0},
	{"socket directory's parent, created too", "run", fs.ModeDir, 0},
	{"checkpoint directory", "lib/ck", fs.ModeDir, 0},
	{"checkpoint directory's parent, created too", "lib", fs.ModeDir, 0},
	{"kubelet.sock", "run/dp/" + devicemanager.KubeletSocketName, fs.ModeSocket, 0o660},
	{"checkpoint", "lib/ck/" + checkpoint.DeviceManagerKey, 0, 0o600},
	{"podresources socket", "run/pr/" + devicemanager.KubeletSocketName, fs.ModeSocket, 0o660},
}

// permResult maps each name of permPaths to its mode (fs.FileMode bits).
type permResult struct {
	Modes map[string]uint32
}

func TestPermissions(t *testing.T) {
	fig := Figures{Category: "permissions"}
	defer recordOnExit(t, &fig, time.Now())
	for _, mask := range []os.FileMode{0o022, 0o000, 0o077} {
		t.Run(fmt.Sprintf("umask %04o", uint32(mask)), func(t *testing.T) {
			var res permResult
			require.True(t, runRoleChild(t, rolePermissions, []string{
				envPermDir + "=" + shortDir(t),
				envPermUmask + "=" + strconv.FormatUint(uint64(mask), 8),
			}, &res), "the child reported no result")
			for _, p := range permPaths {
				m, ok := res.Modes[p.name]
				if !assert.True(t, ok, "no mode for %s", p.name) {
					continue
				}
				mode, want := os.FileMode(m), p.mode
				if want == 0 {
					want = 0o750 &^ mask
				}
				assert.Equal(t, p.typ, mode.Type(), "the type of the %s", p.name)
				fig.Cases++
				fig.exactText(t, fmt.Sprintf("umask %04o: %s", uint32(mask), p.name),
					fmt.Sprintf("%04o", uint32(mode.Perm())), fmt.Sprintf("%04o", uint32(want)))
			}
		})
	}
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
