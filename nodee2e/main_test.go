package nodee2e

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A run is one node, whole inside fresh mount, network and PID namespaces
// (unshare -m -n -p --kill-child): TestMain builds what the node needs, then
// runs the tests again inside the namespaces, where /var/lib, /var/log, /run
// and /tmp are the run's own directories and loopback is the only network.
// Every process, mount and bridge of the node dies with the namespaces; the
// run's directory and its cgroup root are removed after.
const (
	// innerEnv, set inside the namespaces, holds the run's directory.
	innerEnv = "DEVMGR_NODE_E2E_DIR"
	// runBase is where runs make their directory: not under /tmp, which
	// each run covers with a tmpfs of its own.
	runBase = "/var/tmp"
)

// coveredDirs are the host's directories the namespaces cover with the
// run's own: the last is a tmpfs.
var coveredDirs = []string{"/var/lib", "/var/log", "/run", "/tmp"}

var reportPath = flag.String("report", "", "write the scenario table (docs/NODE-E2E.md) to this file after the run")

// run is what the namespaces' side learns from the side that made them.
type run struct {
	Dir        string   // the run's directory
	CgroupRoot string   // the kubelet's cgroupRoot, made in every cgroup v1 hierarchy
	Bins       binaries // what was built for the run
}

// the is the run, inside the namespaces.
var the run

func TestMain(m *testing.M) {
	flag.Parse()
	if dir := os.Getenv(innerEnv); dir != "" {
		if err := enter(dir); err != nil {
			fmt.Fprintln(os.Stderr, "node-e2e:", err)
			os.Exit(1)
		}
		os.Exit(m.Run())
	}
	os.Exit(outside())
}

// outside builds the node's parts, runs the tests inside new namespaces,
// writes the report, and removes what the run made.
func outside() int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "node-e2e: the node needs root (namespaces, cgroups, mounts, containers)")
		return 1
	}
	if missing := missingHostParts(); len(missing) > 0 {
		fmt.Fprintf(os.Stderr, "node-e2e: the node needs %s (Debian: apt-get install runc containernetworking-plugins busybox-static iproute2 util-linux)\n",
			strings.Join(missing, ", "))
		return 1
	}
	dir, err := os.MkdirTemp(runBase, "devmgr-node-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "node-e2e:", err)
		return 1
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintln(os.Stderr, "node-e2e: removing the run directory:", err)
		}
	}()
	r := run{Dir: dir, CgroupRoot: fmt.Sprintf("devmgr-node-e2e-%d", os.Getpid())}
	if r.Bins, err = build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "node-e2e: build:", err)
		return 1
	}
	if err := makeCgroupRoot(r.CgroupRoot); err != nil {
		fmt.Fprintln(os.Stderr, "node-e2e:", err)
		removeCgroupRoot(r.CgroupRoot)
		return 1
	}
	defer removeCgroupRoot(r.CgroupRoot)
	// The kubelet sets kernel tunables that no namespace confines: they
	// are put back as they were.
	saved, err := saveSysctls()
	if err != nil {
		fmt.Fprintln(os.Stderr, "node-e2e:", err)
		return 1
	}
	defer restoreSysctls(saved)
	b, err := json.Marshal(r)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "run.json"), b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "node-e2e:", err)
		return 1
	}

	cmd := exec.Command("unshare", append([]string{"--mount", "--net", "--pid", "--fork", "--kill-child", "--mount-proc",
		"--propagation", "private", os.Args[0]}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), innerEnv+"="+dir)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// An interrupt ends the node (its PID namespace dies with unshare's
	// child) and still removes what the run made.
	sigs := make(chan os.Signal, 1)
	// SIGQUIT is what go test sends a test binary past its -timeout.
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "node-e2e: unshare:", err)
		return 1
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			_ = cmd.Process.Kill()
		case <-done:
		}
	}()
	err = cmd.Wait()
	close(done)
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
		if code < 0 {
			code = 1
		}
	case err != nil:
		fmt.Fprintln(os.Stderr, "node-e2e: unshare:", err)
		code = 1
	}
	if *reportPath != "" {
		if err := writeReport(*reportPath, filepath.Join(dir, resultsFile), code, r.Bins); err != nil {
			fmt.Fprintln(os.Stderr, "node-e2e: report:", err)
			code = 1
		}
	}
	return code
}

// hostParts are what the node takes from the host's packages: runc, the
// CNI plugins the bridge network uses, a static busybox for the test image,
// ip and unshare.
var hostParts = []string{"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback", staticBusybox}

func missingHostParts() []string {
	var missing []string
	for _, cmd := range []string{"runc", "ip", "unshare"} {
		if _, err := exec.LookPath(cmd); err != nil {
			missing = append(missing, cmd)
		}
	}
	for _, f := range hostParts {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f)
		}
	}
	return missing
}

// enter makes the namespaces the node's: loopback up, and the run's own
// /var/lib (the kubelet's root, CNI's state), /var/log (pod logs), /run
// (containerd's shims and network namespaces, CDI specs) and /tmp.
func enter(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "run.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &the); err != nil {
		return err
	}
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("ip link set lo up: %w: %s", err, out)
	}
	for _, m := range coveredDirs[:3] {
		src := filepath.Join(dir, "root", strings.ReplaceAll(strings.TrimPrefix(m, "/"), "/", "-"))
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(src, m, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", src, m, err)
		}
	}
	if err := unix.Mount("node-e2e-tmp", coveredDirs[3], "tmpfs", 0, "mode=1777"); err != nil {
		return fmt.Errorf("tmpfs on /tmp: %w", err)
	}
	return nil
}

// cgroupHierarchies are the mount points of the host's cgroup hierarchies,
// from /proc/self/mountinfo, each once: every v1 hierarchy (a host may
// link several names to one, cpu and cpuacct to cpu,cpuacct), and the v2
// one, beside them on a hybrid host (runc makes its cgroups there too) or
// alone on a v2 host. The kubelet's cgroupRoot must exist in each.
func cgroupHierarchies() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		fields := strings.Fields(line)
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+1 >= len(fields) {
			continue
		}
		if fs := fields[sep+1]; (fs == "cgroup" || fs == "cgroup2") && !slices.Contains(out, fields[4]) {
			out = append(out, fields[4])
		}
	}
	return out
}

// makeCgroupRoot makes name in every cgroup v1 hierarchy; a cpuset gets
// its parent's CPUs and memory nodes, which a new v1 cpuset lacks.
func makeCgroupRoot(name string) error {
	hierarchies := cgroupHierarchies()
	if len(hierarchies) == 0 {
		return errors.New("no cgroup hierarchy under /sys/fs/cgroup")
	}
	for _, h := range hierarchies {
		dir := filepath.Join(h, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// removeCgroupRoot removes name and every cgroup under it, deepest first,
// in every hierarchy. The node's processes die with its PID namespace; a
// cgroup stays busy until the last of them is gone, so each removal is
// tried again for up to cgroupGrace.
func removeCgroupRoot(name string) {
	for _, h := range cgroupHierarchies() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, name), func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := rmdirWhenEmpty(dirs[i]); err != nil {
				fmt.Fprintf(os.Stderr, "node-e2e: removing cgroup %s: %v\n", dirs[i], err)
			}
		}
	}
}

const cgroupGrace = 10 * time.Second

// kernelTunables are the sysctls the kubelet sets at start
// (protectKernelDefaults is false), none of them per namespace.
var kernelTunables = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

func saveSysctls() (map[string][]byte, error) {
	saved := map[string][]byte{}
	for _, k := range kernelTunables {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			return nil, fmt.Errorf("saving the kernel tunables the kubelet sets: %w", err)
		}
		saved[k] = b
	}
	return saved, nil
}

func restoreSysctls(saved map[string][]byte) {
	for k, b := range saved {
		if err := os.WriteFile("/proc/sys/"+k, b, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "node-e2e: restoring %s: %v\n", k, err)
		}
	}
}

func rmdirWhenEmpty(dir string) error {
	deadline := time.Now().Add(cgroupGrace)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
		<-tick.C
	}
}
