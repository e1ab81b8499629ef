//go:build interop

package interop

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Kubernetes sample device plugin (k8s.io/kubernetes v1.37.2,
// test/images/sample-device-plugin): resource example.com/resource with
// Dev-1 and Dev-2, an endpoint named "dp.<unix time>" (no .sock), a mount
// /tmp/Dev-N per device (the plugin creates that file), a CDI name with
// CDI_ENABLED, and a watch on kubelet.sock that re-registers about 10 s after
// the socket is re-created.
const (
	sampleResource = "example.com/resource"
	restartWait    = 90 * time.Second
	// grpcurl (github.com/fullstorydev/grpcurl) is the podresources client
	// nobody on the team wrote, fed with the kubelet's own api.proto.
	grpcurlVersion = "v1.9.4"
)

// repoRoot is the module root, two levels up from this package.
var repoRoot = func() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return filepath.Dir(wd)
}()

// buildBinaries builds devmgr and the sample plugin into .cache/interop/bin;
// the plugin's module downloads and build cache live under .cache/interop
// too, so repeated runs take seconds.
func buildBinaries(t *testing.T) (devmgr, plugin, grpcurl string) {
	t.Helper()
	cache := filepath.Join(repoRoot, ".cache", "interop")
	bin := filepath.Join(cache, "bin")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	devmgr = filepath.Join(bin, "devmgr")
	run(t, repoRoot, nil, "go", "build", "-o", devmgr, "./cmd/devmgr")
	plugin = filepath.Join(bin, "sample-device-plugin")
	start := time.Now()
	grpcurl = filepath.Join(bin, "grpcurl")
	run(t, repoRoot, []string{
		"GOBIN=" + bin,
		"GOMODCACHE=" + filepath.Join(cache, "mod"),
		"GOCACHE=" + filepath.Join(cache, "build"),
		"GOFLAGS=",
	}, "go", "install", "github.com/fullstorydev/grpcurl/cmd/grpcurl@"+grpcurlVersion)
	run(t, filepath.Join(repoRoot, "interop", "sampleplugin"), []string{
		"GOMODCACHE=" + filepath.Join(cache, "mod"),
		"GOCACHE=" + filepath.Join(cache, "build"),
		"GOFLAGS=-mod=readonly",
	}, "go", "build", "-o", plugin, "k8s.io/kubernetes/test/images/sample-device-plugin")
	t.Logf("built devmgr, the sample device plugin (k8s.io/kubernetes v1.37.2) and grpcurl %s in %s", grpcurlVersion, time.Since(start).Round(time.Second))
	return devmgr, plugin, grpcurl
}

func run(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %v:\n%s", name, args, out)
}

// requireUnshare skips, saying why, where a private mount namespace cannot
// be made: the sample plugin registers at the fixed path
// /var/lib/kubelet/device-plugins/kubelet.sock, which must not be the host's.
func requireUnshare(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIP interop: the sample device plugin needs root (unshare -m and mounts); run make interop as root")
	}
	if out, err := exec.Command("unshare", "-m", "--propagation", "private", "true").CombinedOutput(); err != nil {
		t.Skipf("SKIP interop: unshare -m is not permitted here (%v: %s); the sample device plugin was not run", err, bytes.TrimSpace(out))
	}
}

// testDirs makes a short directory (unix socket paths), removed at the end,
// with the socket directory and the plugin's /tmp in it.
func testDirs(t *testing.T) (dir, sockDir, pluginTmp string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "io")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	sockDir = filepath.Join(dir, "dp")
	pluginTmp = filepath.Join(dir, "ptmp")
	require.NoError(t, os.MkdirAll(sockDir, 0o750))
	require.NoError(t, os.MkdirAll(pluginTmp, 0o755))
	return dir, sockDir, pluginTmp
}

// startSamplePlugin starts the sample plugin, with CDI_ENABLED, in a private
// mount namespace where it sees sockDir as /var/lib/kubelet/device-plugins
// and pluginTmp as its /tmp, with private /var/lib and /run.
func startSamplePlugin(t *testing.T, pluginBin, sockDir, pluginTmp, logPath string) *process {
	t.Helper()
	script := `set -e
mount -t tmpfs tmpfs /var/lib
mkdir -p /var/lib/kubelet/device-plugins
mount --bind "$SOCK_DIR" /var/lib/kubelet/device-plugins
mount -t tmpfs tmpfs /run
mkdir -p /run/cdi /run/interop-bin
mount --bind "$BIN_DIR" /run/interop-bin
mount --bind "$PLUGIN_TMP" /tmp
exec /run/interop-bin/sample-device-plugin`
	return startProcess(t, "sample device plugin", logPath, []string{
		"SOCK_DIR=" + sockDir, "BIN_DIR=" + filepath.Dir(pluginBin), "PLUGIN_TMP=" + pluginTmp, "CDI_ENABLED=1",
	}, "unshare", "-m", "--propagation", "private", "sh", "-c", script)
}

// process is a started command with its output in a log file.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan error
}

func startProcess(t *testing.T, name, logPath string, env []string, args ...string) *process {
	t.Helper()
	f, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	require.NoError(t, cmd.Start())
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan error, 1)}
	go func() {
		p.done <- cmd.Wait()
		f.Close()
	}()
	t.Cleanup(func() { _ = p.stop(t) })
	return p
}

// stop sends SIGTERM and waits (up to 20 s, then SIGKILL); it returns the
// exit error.
func (p *process) stop(t *testing.T) error {
	t.Helper()
	if p.cmd.ProcessState != nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		err := <-p.done
		p.done <- err
		t.Errorf("%s did not stop within 20 s of SIGTERM; log %s", p.name, p.log)
		return err
	}
}

func (p *process) tail() string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// The JSON of devmgr's control API (the fields this suite reads).
type statusJSON struct {
	Resources []struct {
		Name        string `json:"name"`
		Capacity    int    `json:"capacity"`
		Allocatable int    `json:"allocatable"`
		Allocated   int    `json:"allocated"`
		Free        int    `json:"free"`
		Devices     []struct {
			ID     string `json:"id"`
			Health string `json:"health"`
		} `json:"devices"`
	} `json:"resources"`
	Endpoints []struct {
		Resource string `json:"resource"`
		Socket   string `json:"socket"`
		Stopped  bool   `json:"stopped"`
	} `json:"endpoints"`
}

type admitJSON struct {
	Pod        struct{ UID string } `json:"pod"`
	Containers []struct {
		Name       string              `json:"name"`
		Devices    map[string][]string `json:"devices"`
		RunOptions struct {
			Mounts []struct {
				ContainerPath string `json:"containerPath"`
				HostPath      string `json:"hostPath"`
			} `json:"mounts"`
			CDIDevices []struct {
				Name string `json:"name"`
			} `json:"cdiDevices"`
		} `json:"runOptions"`
	} `json:"containers"`
	Error string `json:"error"`
}

// client runs devmgr's client commands against one control socket.
type client struct {
	t       *testing.T
	devmgr  string
	control string
}

// call runs `devmgr <args> --control-socket S --json` and decodes its output
// into v; it returns the exit code.
func (c client) call(v any, stdin string, args ...string) int {
	c.t.Helper()
	cmd := exec.Command(c.devmgr, append(args, "--control-socket", c.control, "--json")...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(c.t, err)
	}
	if v != nil && out.Len() > 0 {
		require.NoError(c.t, json.Unmarshal(out.Bytes(), v), "devmgr %v: %s %s", args, out.String(), errOut.String())
	}
	return code
}

func (c client) status() (st statusJSON, ok bool) {
	c.t.Helper()
	return st, c.call(&st, "", "status") == 0
}

// resource returns the status line of the sample resource.
func (c client) resource() (capacity, allocatable, allocated int, devices []string, found bool) {
	c.t.Helper()
	st, ok := c.status()
	if !ok {
		return 0, 0, 0, nil, false
	}
	for _, r := range st.Resources {
		if r.Name == sampleResource {
			for _, d := range r.Devices {
				devices = append(devices, d.ID+"="+d.Health)
			}
			return r.Capacity, r.Allocatable, r.Allocated, devices, true
		}
	}
	return 0, 0, 0, nil, false
}

func waitFor(t *testing.T, what string, within time.Duration, cond func() bool, logs ...*process) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			for _, p := range logs {
				t.Logf("%s log:\n%s", p.name, p.tail())
			}
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		<-tick.C
	}
}

func podYAML(uid string, n int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: interop, uid: %s}
spec:
  containers:
  - name: main
    image: busybox
    resources: {limits: {%s: %d}}
`, uid, uid, sampleResource, n)
}

func TestSampleDevicePlugin(t *testing.T) {
	requireUnshare(t)
	devmgr, pluginBin, grpcurl := buildBinaries(t)
	dir, sockDir, pluginTmp := testDirs(t)
	c := client{t: t, devmgr: devmgr, control: filepath.Join(dir, "ctl.sock")}

	prSocket := filepath.Join(dir, "pr", "kubelet.sock")
	serveArgs := []string{devmgr, "serve", "--socket-dir", sockDir, "--control-socket", c.control, "-v", "2",
		"--podresources-socket", prSocket, "--metrics-address", "127.0.0.1:0",
		"--kubeconfig="} // never the caller's cluster ($KUBECONFIG)
	serve := startProcess(t, "devmgr serve", filepath.Join(dir, "serve.log"), nil, serveArgs...)
	waitFor(t, "devmgr serve to answer", 10*time.Second, func() bool { _, ok := c.status(); return ok }, serve)

	plugin := startSamplePlugin(t, pluginBin, sockDir, pluginTmp, filepath.Join(dir, "plugin.log"))

	waitFor(t, "the sample plugin to register Dev-1 and Dev-2", 30*time.Second, func() bool {
		capacity, allocatable, _, devs, ok := c.resource()
		return ok && capacity == 2 && allocatable == 2 && slices.Equal(devs, []string{"Dev-1=Healthy", "Dev-2=Healthy"})
	}, serve, plugin)
	st, _ := c.status()
	var socket string
	for _, e := range st.Endpoints {
		if e.Resource == sampleResource {
			socket = filepath.Base(e.Socket)
		}
	}
	assert.True(t, strings.HasPrefix(socket, "dp."), "endpoint %q", socket)
	t.Logf("registered: %s with Dev-1 and Dev-2 on endpoint %s (no .sock suffix); capacity 2", sampleResource, socket)

	// Admission returns the plugin's mount and CDI name; the plugin created
	// the fake device in its own /tmp.
	var a admitJSON
	require.Equal(t, 0, c.call(&a, podYAML("interop-1", 1), "admit", "-f", "-"), "admit: %s", a.Error)
	require.Len(t, a.Containers, 1)
	got := a.Containers[0].Devices[sampleResource]
	require.Len(t, got, 1)
	dev := got[0]
	assert.Contains(t, []string{"Dev-1", "Dev-2"}, dev)
	require.Len(t, a.Containers[0].RunOptions.Mounts, 1)
	assert.Equal(t, "/tmp/"+dev, a.Containers[0].RunOptions.Mounts[0].ContainerPath)
	assert.Equal(t, "/tmp/"+dev, a.Containers[0].RunOptions.Mounts[0].HostPath)
	require.Len(t, a.Containers[0].RunOptions.CDIDevices, 1)
	assert.Equal(t, sampleResource+"=CDI-"+dev, a.Containers[0].RunOptions.CDIDevices[0].Name)
	_, err := os.Stat(filepath.Join(pluginTmp, dev))
	assert.NoError(t, err, "the plugin's fake device file, in its private /tmp")
	t.Logf("allocated: pod interop-1 got %s, mount /tmp/%s, CDI %s", dev, dev, a.Containers[0].RunOptions.CDIDevices[0].Name)

	// Releasing the pod frees the device.
	require.Equal(t, 0, c.call(nil, "", "release", "interop-1"))
	_, _, allocated, _, _ := c.resource()
	assert.Equal(t, 0, allocated, "released")
	t.Logf("released: interop-1; %s has no device allocated", sampleResource)

	var kept admitJSON
	require.Equal(t, 0, c.call(&kept, podYAML("interop-2", 1), "admit", "-f", "-"), "admit: %s", kept.Error)
	keptDev := kept.Containers[0].Devices[sampleResource][0]

	// A podresources client nobody on the team wrote lists exactly that.
	listed := podresourcesDevices(t, grpcurl, prSocket, "List")
	assert.Equal(t, []string{"interop/interop-2/main/" + sampleResource + "=" + keptDev}, listed)
	allocatable := podresourcesDevices(t, grpcurl, prSocket, "GetAllocatableResources")
	assert.Equal(t, []string{sampleResource + "=Dev-1", sampleResource + "=Dev-2"}, allocatable)
	t.Logf("podresources (grpcurl %s): List %v, GetAllocatableResources %v", grpcurlVersion, listed, allocatable)

	// /metrics carries the kubelet's metric names.
	metrics := scrape(t, serve)
	assert.Contains(t, metrics, `kubelet_device_plugin_registration_total{resource_name="example.com/resource"} 1`)
	assert.Contains(t, metrics, `kubelet_device_plugin_alloc_duration_seconds_count{resource_name="example.com/resource"} 2`)

	// Restart devmgr serve on the same directory: kubelet.sock is re-created,
	// the plugin notices and registers again, the allocation is kept.
	require.NoError(t, serve.stop(t), "serve exits 0 on SIGTERM")
	serve = startProcess(t, "devmgr serve (restarted)", filepath.Join(dir, "serve2.log"), nil, serveArgs...)
	waitFor(t, "the restarted devmgr serve to answer", 10*time.Second, func() bool { _, ok := c.status(); return ok }, serve)
	capacity, _, allocated, _, found := c.resource()
	assert.True(t, found, "the resource is known from the checkpoint before the plugin is back")
	assert.Equal(t, []int{0, 1}, []int{capacity, allocated})
	start := time.Now()
	waitFor(t, "the sample plugin to register again after kubelet.sock was re-created", restartWait, func() bool {
		capacity, allocatable, allocated, _, ok := c.resource()
		return ok && capacity == 2 && allocatable == 2 && allocated == 1
	}, serve, plugin)
	t.Logf("came back: the sample plugin registered again %s after devmgr serve restarted", time.Since(start).Round(time.Second))

	var pods struct {
		Pods []struct {
			UID        string `json:"uid"`
			Containers []struct {
				Devices map[string][]string `json:"devices"`
			} `json:"containers"`
		} `json:"pods"`
	}
	require.Equal(t, 0, c.call(&pods, "", "pods"))
	require.Len(t, pods.Pods, 1)
	assert.Equal(t, "interop-2", pods.Pods[0].UID)
	assert.Equal(t, []string{keptDev}, pods.Pods[0].Containers[0].Devices[sampleResource], "allocation kept")

	var refused admitJSON
	assert.NotEqual(t, 0, c.call(&refused, podYAML("interop-3", 2), "admit", "-f", "-"))
	assert.Equal(t, "requested number of devices unavailable for example.com/resource. Requested: 2, Available: 1", refused.Error)
	t.Logf("kept: interop-2 still holds %s; a pod asking for 2 is refused with the kubelet's wording", keptDev)

	require.NoError(t, plugin.stop(t))
	require.NoError(t, serve.stop(t))
}

// podresourcesDevices calls a PodResourcesLister method with grpcurl and
// returns the devices it reports, sorted: "ns/pod/container/resource=id" for
// List, "resource=id" for GetAllocatableResources.
func podresourcesDevices(t *testing.T, grpcurl, socket, method string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubelet").Output()
	require.NoError(t, err)
	protoDir := filepath.Join(strings.TrimSpace(string(out)), "pkg", "apis", "podresources", "v1")
	cmd := exec.Command(grpcurl, "-plaintext", "-unix", "-import-path", protoDir, "-proto", "api.proto",
		"-emit-defaults", socket, "v1.PodResourcesLister/"+method)
	cmd.Dir = repoRoot
	body, err := cmd.CombinedOutput()
	require.NoError(t, err, "grpcurl %s: %s", method, body)
	type device struct {
		ResourceName string   `json:"resourceName"`
		DeviceIDs    []string `json:"deviceIds"`
	}
	var reply struct {
		PodResources []struct {
			Name, Namespace string
			Containers      []struct {
				Name    string
				Devices []device
			}
		} `json:"podResources"`
		Devices []device `json:"devices"`
	}
	require.NoError(t, json.Unmarshal(body, &reply), "%s", body)
	var got []string
	for _, p := range reply.PodResources {
		for _, c := range p.Containers {
			for _, d := range c.Devices {
				for _, id := range d.DeviceIDs {
					got = append(got, p.Namespace+"/"+p.Name+"/"+c.Name+"/"+d.ResourceName+"="+id)
				}
			}
		}
	}
	for _, d := range reply.Devices {
		for _, id := range d.DeviceIDs {
			got = append(got, d.ResourceName+"="+id)
		}
	}
	slices.Sort(got)
	return got
}

// scrape reads the metrics of a devmgr serve, whose log names the address.
func scrape(t *testing.T, serve *process) string {
	t.Helper()
	logText, err := os.ReadFile(serve.log)
	require.NoError(t, err)
	m := regexp.MustCompile(`Serving metrics.*address="([^"]+)"`).FindSubmatch(logText)
	require.Len(t, m, 2, "no metrics address in the log")
	resp, err := http.Get("http://" + string(m[1]) + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}
