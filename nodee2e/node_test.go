package nodee2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openkubelet/devmgr/e2e/cluster"
)

// The fixed places of a kubelet 1.37 node: kubelet.sock is served in
// pluginsDir whatever --root-dir says, and the podresources socket lies
// under the root directory. Inside the run's namespaces /var/lib is the
// run's own.
const (
	kubeletRoot        = "/var/lib/kubelet"
	pluginsDir         = kubeletRoot + "/device-plugins"
	kubeletSocket      = pluginsDir + "/kubelet.sock"
	podResourcesSocket = kubeletRoot + "/pod-resources/kubelet.sock"
	cdiDir             = "/var/run/cdi"
	// How soon the kubelet must serve after it starts, and report a
	// change in the node status (nodeStatusUpdateFrequency is 1s).
	kubeletStartLimit = 2 * time.Minute
)

// containerd is the node's container runtime, for the whole run.
type containerd struct {
	proc *cluster.Process
	dir  string
	sock string
	ctr  string
}

// startContainerd starts containerd with its root, state and socket in
// dir/containerd, the CRI plugin on cgroupfs with CDI specs read from
// cdiDir, a bridge network, and the run's images imported.
func startContainerd(t *testing.T, dir string) *containerd {
	t.Helper()
	c := &containerd{dir: filepath.Join(dir, "containerd")}
	c.sock = filepath.Join(c.dir, "containerd.sock")
	c.ctr = filepath.Join(the.Bins.ContainerdDir, "ctr")
	cniConf := filepath.Join(c.dir, "net.d")
	for _, d := range []string{c.dir, cniConf, cdiDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cluster.WriteFile(t, filepath.Join(cniConf, "10-bridge.conflist"), `{
  "cniVersion": "1.0.0",
  "name": "node-e2e",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
`)
	config := filepath.Join(c.dir, "config.toml")
	cluster.WriteFile(t, config, fmt.Sprintf(`version = 4
root = %[1]q
state = %[2]q
imports = []
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs",
  "io.containerd.snapshotter.v1.blockfile", "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[plugins.'io.containerd.server.v1.grpc']
  address = %[3]q

[plugins.'io.containerd.server.v1.ttrpc']
  address = %[4]q

[plugins.'io.containerd.internal.v1.opt']
  path = %[5]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[6]q

[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = [%[7]q]
  # Root here lacks CAP_SYS_RESOURCE: no container may lower its OOM score.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = %[8]q
`, filepath.Join(c.dir, "root"), filepath.Join(c.dir, "state"), c.sock, c.sock+".ttrpc", filepath.Join(c.dir, "opt"),
		pauseImage, cdiDir, cniConf))
	cmd := exec.Command(filepath.Join(the.Bins.ContainerdDir, "containerd"), "--config", config, "--log-level", "info")
	// The shim is found on PATH, and runc (Debian's) beside the system's.
	cmd.Env = append(os.Environ(), "PATH="+the.Bins.ContainerdDir+":"+os.Getenv("PATH"))
	c.proc = cluster.StartCmd(t, dir, "containerd", cmd)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster.Poll(t, ctx, c.proc, "containerd's socket", time.Minute, func() bool {
		return exec.Command(c.ctr, "--address", c.sock, "version").Run() == nil
	})
	for _, img := range the.Bins.Images {
		if out, err := exec.Command(c.ctr, "--address", c.sock, "-n", "k8s.io", "images", "import", img).CombinedOutput(); err != nil {
			t.Fatalf("ctr images import %s: %v\n%s", img, err, out)
		}
	}
	return c
}

// runningTasks returns the IDs of the containers whose task runs.
func (c *containerd) runningTasks(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command(c.ctr, "--address", c.sock, "-n", "k8s.io", "tasks", "ls").Output()
	if err != nil {
		t.Fatalf("ctr tasks ls: %v", err)
	}
	running := map[string]bool{}
	for line := range strings.Lines(string(out)) {
		// TASK PID STATUS
		if f := strings.Fields(line); len(f) == 3 && f[2] == "RUNNING" {
			running[f[0]] = true
		}
	}
	return running
}

// kubelet is one kubelet process on the node at a time, of one kind, on
// the node's root directory.
type kubelet struct {
	kind     string             // stockKubelet or devmgrKubelet
	node     string             // its Node's name
	dir      string             // where its configuration and logs are
	proc     *cluster.Process   // the current process
	procs    []*cluster.Process // every process, the current one last
	healthz  string
	starts   int
	args     []string
	started  time.Time
	runtimes *containerd
}

// newKubelet writes the configuration of a kubelet of kind for node, whose
// API server is c's: cgroup v1 with cgroupfs under the run's cgroup root,
// containerd's socket, the node status reported every second, and
// authentication and authorization that let the API server in.
func newKubelet(t *testing.T, c *cluster.Cluster, rt *containerd, kind, node, dir string) *kubelet {
	t.Helper()
	k := &kubelet{kind: kind, node: node, dir: dir, runtimes: rt}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	port, healthz := cluster.FreePort(t), cluster.FreePort(t)
	k.healthz = fmt.Sprintf("http://127.0.0.1:%d/healthz", healthz)
	config := filepath.Join(dir, "kubelet.yaml")
	cluster.WriteFile(t, config, fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
containerRuntimeEndpoint: unix://%s
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
failSwapOn: false
resolvConf: ""
nodeStatusUpdateFrequency: 1s
nodeStatusReportFrequency: 1s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%"}
serializeImagePulls: false
`, the.CgroupRoot, rt.sock, port, healthz))
	k.args = []string{"--config", config, "--kubeconfig", c.Kubeconfig, "--hostname-override", node,
		"--node-ip", "127.0.0.1", "--v", "2"}
	return k
}

// start starts the kubelet and waits until it is healthy and serves a
// kubelet.sock of its own: a plugin registers only then, as one watching
// the socket does, since the device manager removes every socket it finds
// in the directory when it starts.
func (k *kubelet) start(t *testing.T, bin string) {
	t.Helper()
	k.starts++
	name := fmt.Sprintf("kubelet-%s-%d", k.kind, k.starts)
	k.started = time.Now()
	// The node owns its kubelet (startNode stops it after deleting the
	// pods), whichever process it is by then.
	p, err := cluster.Launch(k.dir, name, exec.Command(bin, k.args...))
	if err != nil {
		t.Fatal(err)
	}
	k.proc = p
	k.procs = append(k.procs, p)
	if err := cluster.AwaitHTTP(k.proc, k.healthz, ""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), kubeletStartLimit)
	defer cancel()
	cluster.Poll(t, ctx, k.proc, "a new kubelet.sock that accepts connections", kubeletStartLimit, func() bool {
		// Made after the start: a stopped kubelet may leave its socket, and
		// a new one may get the old one's inode.
		fi, err := os.Stat(kubeletSocket)
		if err != nil || !fi.ModTime().After(k.started) {
			return false
		}
		conn, err := net.Dial("unix", kubeletSocket)
		if err != nil {
			return false
		}
		_ = conn.Close()
		return true
	})
	k.requireDeviceManager(t)
}

// stop stops the kubelet with SIGTERM; the pods' containers keep running.
func (k *kubelet) stop(t *testing.T) {
	t.Helper()
	if code := k.proc.Stop(); code != 0 && code != -1 {
		t.Logf("%s exited %d", k.proc.Name, code)
	}
}

// freshRoot gives the kubelet root an empty directory of dir's, in place
// of the previous one: each node of the run starts on its own.
func freshRoot(t *testing.T, dir string) {
	t.Helper()
	root := filepath.Join(dir, "kubelet-root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(kubeletRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(root, kubeletRoot, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s on %s: %v", root, kubeletRoot, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(kubeletRoot, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", kubeletRoot, err)
		}
	})
}

// deleteNode removes the Node, once its kubelet is gone.
func deleteNode(t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	err := c.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete node %s: %v", name, err)
	}
}

// devmgrLine is what make kubelet's kubelet logs when it makes its device
// manager (kubelet/cm/devmgr.go).
const devmgrLine = "Using devmgr as the device manager"

// requireDeviceManager fails unless the running kubelet's device manager is
// devmgr exactly when its kind is devmgrKubelet.
func (k *kubelet) requireDeviceManager(t *testing.T) {
	t.Helper()
	if got := strings.Contains(k.proc.Output(), devmgrLine); got != (k.kind == devmgrKubelet) {
		t.Fatalf("the %s kubelet logged %q: %v", k.kind, devmgrLine, got)
	}
}
