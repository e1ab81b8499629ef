package nodee2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/e2e/cluster"
	"github.com/openkubelet/devmgr/plugintest"
)

// The two device plugins of the node. The Kubernetes sample device plugin
// (test/images/sample-device-plugin) serves sampleResource: Dev-1 and Dev-2,
// a mount of the file /tmp/Dev-N each, and with CDI_ENABLED a CDI device
// whose spec (it writes /var/run/cdi/example.com.json) sets CDI_DEVICE and
// a block device node /tmp/CDI-Dev-N. The plugintest plugin serves
// fpgaResource with what Allocate can return: an environment variable,
// a read-only mount, a device node, and a CDI device per device. A second
// plugintest plugin of the same kind serves draResource to devmgr serve
// --dra (dra_test.go).
const (
	sampleResource = "example.com/resource"
	fpgaResource   = "example.com/fpga"
	fpgaCount      = 3
)

// samplePlugin is the sample device plugin's process.
type samplePlugin struct {
	proc *cluster.Process
	dir  string
	runs int
}

// startSamplePlugin starts the sample device plugin with CDI on; it
// registers at kubelet.sock and registers again whenever the kubelet makes
// the socket anew.
func startSamplePlugin(t *testing.T, dir string) *samplePlugin {
	t.Helper()
	s := &samplePlugin{dir: dir}
	s.start(t)
	return s
}

func (s *samplePlugin) start(t *testing.T) {
	t.Helper()
	s.runs++
	cmd := exec.Command(the.Bins.SamplePlugin)
	cmd.Env = append(os.Environ(), "CDI_ENABLED=1")
	s.proc = cluster.StartCmd(t, s.dir, fmt.Sprintf("sample-device-plugin-%d", s.runs), cmd)
}

// restart stops the plugin and starts it again, as a crash and a restart
// by its DaemonSet would.
func (s *samplePlugin) restart(t *testing.T) {
	t.Helper()
	s.proc.Kill()
	s.start(t)
}

// fpgaPlugin is a plugintest plugin with real device nodes, mounts and CDI
// specs on the node, and the Allocate responses it gave.
type fpgaPlugin struct {
	// resource is its resource name, and the kind of its CDI devices;
	// socketDir is where it serves its socket and finds kubelet.sock.
	resource  string
	socketDir string
	dir       string
	ids       []string

	mu        sync.Mutex
	p         *plugintest.Plugin
	health    map[string]string
	responses map[string]*pluginapi.ContainerAllocateResponse // by sorted IDs joined
}

// newFPGAPlugin makes the host side in dir of a plugin of resource that
// registers at socketDir/kubelet.sock: per device a directory with a file
// naming it (the mount), a character device node (1:3, the null device),
// and the CDI spec of kind resource in cdiDir.
func newFPGAPlugin(t *testing.T, dir, resource, socketDir string) *fpgaPlugin {
	t.Helper()
	f := &fpgaPlugin{resource: resource, socketDir: socketDir, dir: dir, health: map[string]string{},
		responses: map[string]*pluginapi.ContainerAllocateResponse{}}
	var cdi strings.Builder
	cdi.WriteString(`{"cdiVersion": "0.6.0", "kind": "` + resource + `", "devices": [`)
	for i := range fpgaCount {
		id := fmt.Sprintf("fpga-%d", i)
		f.ids = append(f.ids, id)
		f.health[id] = pluginapi.Healthy
		if err := os.MkdirAll(filepath.Join(dir, "data", id), 0o755); err != nil {
			t.Fatal(err)
		}
		cluster.WriteFile(t, filepath.Join(dir, "data", id, "id"), id)
		if err := os.MkdirAll(filepath.Join(dir, "dev"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(filepath.Join(dir, "dev", id), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatalf("mknod: %v", err)
		}
		if i > 0 {
			cdi.WriteString(",")
		}
		fmt.Fprintf(&cdi, `{"name": %q, "containerEdits": {"env": ["CDI_FPGA_%d=%s"]}}`, id, i, id)
	}
	cdi.WriteString("]}\n")
	cluster.WriteFile(t, filepath.Join(cdiDir, strings.ReplaceAll(resource, "/", "-")+".json"), cdi.String())
	return f
}

// start starts a plugin process's worth of the plugin (a new
// plugintest.Plugin, as a restarted plugin is new) and registers it.
func (f *fpgaPlugin) start(t *testing.T) {
	t.Helper()
	// NoReregister: a restart of the plugin is played by a new Plugin, and
	// the scenarios decide when it is back.
	p, err := plugintest.New(plugintest.Options{ResourceName: f.resource, SocketDir: f.socketDir, Devices: f.devices(), NoReregister: true})
	if err != nil {
		t.Fatal(err)
	}
	p.SetAllocateFunc(func(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		resp := &pluginapi.AllocateResponse{}
		for _, cr := range req.GetContainerRequests() {
			resp.ContainerResponses = append(resp.ContainerResponses, f.allocate(cr.GetDevicesIds()))
		}
		return resp, nil
	})
	t.Cleanup(p.Stop)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if err := p.Register(filepath.Join(f.socketDir, "kubelet.sock")); err != nil {
		t.Fatalf("register %s: %v", f.resource, err)
	}
	f.mu.Lock()
	f.p = p
	f.mu.Unlock()
}

// stop stops the plugin, as its process ending would.
func (f *fpgaPlugin) stop() {
	f.mu.Lock()
	p := f.p
	f.mu.Unlock()
	p.Stop()
}

// restart stops the plugin and starts it again with the same devices.
func (f *fpgaPlugin) restart(t *testing.T) {
	t.Helper()
	f.stop()
	f.start(t)
}

// setHealth sets a device's health and sends the new list.
func (f *fpgaPlugin) setHealth(id, health string) {
	f.mu.Lock()
	f.health[id] = health
	p := f.p
	f.mu.Unlock()
	p.Update(f.devices())
}

func (f *fpgaPlugin) devices() []*pluginapi.Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*pluginapi.Device
	for _, id := range f.ids {
		out = append(out, &pluginapi.Device{ID: id, Health: f.health[id]})
	}
	return out
}

// allocate is the plugin's answer for one container: FPGA_DEVICES, the
// data directory of each device at /fpga/ID, its device node at
// /dev/fpga-N, and its CDI device. The answer is kept for the test to hold
// the container's report against.
func (f *fpgaPlugin) allocate(ids []string) *pluginapi.ContainerAllocateResponse {
	ids = slices.Sorted(slices.Values(ids))
	r := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"FPGA_DEVICES": strings.Join(ids, ",")}}
	for _, id := range ids {
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: "/fpga/" + id, HostPath: filepath.Join(f.dir, "data", id), ReadOnly: true})
		r.Devices = append(r.Devices, &pluginapi.DeviceSpec{ContainerPath: "/dev/" + id, HostPath: filepath.Join(f.dir, "dev", id), Permissions: "rw"})
		r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: f.resource + "=" + id})
	}
	f.mu.Lock()
	f.responses[strings.Join(ids, ",")] = r
	f.mu.Unlock()
	return r
}

// allocateCalls is how many Allocate calls the running instance got.
func (f *fpgaPlugin) allocateCalls() int {
	f.mu.Lock()
	p := f.p
	f.mu.Unlock()
	return len(p.CallsOf(plugintest.MethodAllocate))
}

// response is the Allocate answer the plugin gave for ids, nil if none.
func (f *fpgaPlugin) response(ids []string) *pluginapi.ContainerAllocateResponse {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.responses[strings.Join(slices.Sorted(slices.Values(ids)), ",")]
}

// expectedReport is what a container given ids of the fpga plugin and
// sampleIDs of the sample plugin must report: every variable, mount, device
// node and CDI edit the plugins' Allocate answers and CDI specs hold.
func (f *fpgaPlugin) expectedReport(t *testing.T, ids, sampleIDs []string) report {
	t.Helper()
	var r report
	if len(ids) > 0 {
		resp := f.response(ids)
		if resp == nil {
			t.Fatalf("the fpga plugin answered no Allocate for %v", ids)
		}
		for k, v := range resp.GetEnvs() {
			r.env = append(r.env, k+"="+v)
		}
		for _, m := range resp.GetMounts() {
			mode := "rw"
			if m.GetReadOnly() {
				mode = "ro"
			}
			r.mounts = append(r.mounts, fmt.Sprintf("%s/ %s %s", m.GetContainerPath(), filepath.Base(m.GetContainerPath()), mode))
		}
		for _, d := range resp.GetDevices() {
			r.devices = append(r.devices, d.GetContainerPath()+" character special file 1:3")
		}
		for _, c := range resp.GetCdiDevices() {
			id := strings.TrimPrefix(c.GetName(), f.resource+"=")
			r.env = append(r.env, fmt.Sprintf("CDI_FPGA_%s=%s", strings.TrimPrefix(id, "fpga-"), id))
		}
	}
	switch len(sampleIDs) {
	case 0:
	case 1:
		id := sampleIDs[0]
		r.files = append(r.files, "/tmp/"+id+" regular empty file", "/tmp/CDI-"+id+" block special file")
		r.env = append(r.env, "CDI_DEVICE=CDI-"+id)
	default:
		// Each of the sample plugin's CDI devices sets CDI_DEVICE: with
		// more than one, which wins is not the plugin's to say.
		t.Fatalf("a report checks one device of the sample plugin, not %v", sampleIDs)
	}
	slices.Sort(r.env)
	slices.Sort(r.mounts)
	slices.Sort(r.devices)
	slices.Sort(r.files)
	return r
}
