package main

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/sanity"
)

// nodePlugin is a device plugin as a node runs it, started apart from the
// suite: it watches its directory and, each time kubelet.sock is created,
// starts afresh and registers. It lists devices (default: two GPUs without
// topology); editAllocate, when set, changes each of its Allocate responses.
type nodePlugin struct {
	dir          string
	devices      []*pluginapi.Device
	editAllocate func(*pluginapi.AllocateResponse)

	mu      sync.Mutex
	current *plugintest.Plugin
}

// startNodePlugin watches dir until the test ends.
func startNodePlugin(t *testing.T, dir string, devices []*pluginapi.Device, editAllocate func(*pluginapi.AllocateResponse)) {
	t.Helper()
	if devices == nil {
		devices = []*pluginapi.Device{{ID: "gpu-0", Health: pluginapi.Healthy}, {ID: "gpu-1", Health: pluginapi.Healthy}}
	}
	n := &nodePlugin{dir: dir, devices: devices, editAllocate: editAllocate}
	w, err := fsnotify.NewWatcher()
	require.NoError(t, err)
	require.NoError(t, w.Add(dir))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.Events {
			if ev.Has(fsnotify.Create) && filepath.Base(ev.Name) == "kubelet.sock" {
				if err := n.restart(); err != nil {
					t.Errorf("plugin start: %v", err)
				}
			}
		}
	}()
	t.Cleanup(func() {
		_ = w.Close()
		<-done
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.current != nil {
			n.current.Stop()
		}
	})
}

// restart stops the running plugin, if any, and starts and registers a new
// one. Its Allocate refuses devices it never listed, as a plugin should.
func (n *nodePlugin) restart() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.current != nil {
		n.current.Stop()
	}
	p, err := plugintest.New(plugintest.Options{
		ResourceName:                    "example.com/gpu",
		SocketDir:                       n.dir,
		Devices:                         n.devices,
		PreStartRequired:                true,
		GetPreferredAllocationAvailable: true,
		NoReregister:                    true, // a restart starts a new Plugin, as a new process
	})
	if err != nil {
		return err
	}
	n.current = p
	p.SetAllocateFunc(func(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		for _, cr := range req.ContainerRequests {
			for _, id := range cr.DevicesIds {
				if !slices.ContainsFunc(p.Devices(), func(d *pluginapi.Device) bool { return d.ID == id }) {
					return nil, fmt.Errorf("unknown device %q", id)
				}
			}
		}
		resp := p.DefaultAllocate(req)
		if n.editAllocate != nil {
			n.editAllocate(resp)
		}
		return resp, nil
	})
	if err := p.Start(); err != nil {
		return err
	}
	return p.Register(filepath.Join(n.dir, "kubelet.sock"))
}

var sanityRow = regexp.MustCompile(`^(\S+)\s+(passed|failed|skipped)\s+\S+$`)

// sanityTable reads the summary table: each check's status, in order, and
// the indented messages under it.
func sanityTable(t *testing.T, stdout string) (names []string, status map[string]string, messages map[string][]string) {
	t.Helper()
	status, messages = map[string]string{}, map[string][]string{}
	last := ""
	for _, line := range strings.Split(stdout, "\n") {
		if m := sanityRow.FindStringSubmatch(line); m != nil {
			last = m[1]
			names = append(names, last)
			status[last] = m[2]
		} else if msg, ok := strings.CutPrefix(line, "    "); ok && last != "" {
			messages[last] = append(messages[last], msg)
		}
	}
	return names, status, messages
}

// A plugin that does everything right passes every check that the command
// line can run: list-and-watch/update needs a way to make the plugin send a
// new list, which only sanity.Config.TriggerUpdate gives.
func TestSanityCommandCorrectPlugin(t *testing.T) {
	dir := shortTempDir(t)
	startNodePlugin(t, dir, nil, nil)
	res := devmgr(t, "", "sanity", "--socket-dir", dir, "--register-timeout", "10s", "--reregister-timeout", "10s")
	require.Equal(t, exitOK, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	// While it runs, stderr says what it waits for and each check.
	progress := strings.Split(strings.TrimSuffix(res.stderr, "\n"), "\n")
	require.Len(t, progress, 2+len(sanity.Checks()), res.stderr)
	assert.Equal(t, "Waiting up to 10s for a device plugin to register on "+filepath.Join(dir, "kubelet.sock"), progress[0])
	assert.Equal(t, "Registered: example.com/gpu", progress[1])
	for i, name := range sanity.Checks() {
		assert.Regexp(t, "^"+regexp.QuoteMeta(name)+` \.\.\. (passed|skipped) \(\S+\)$`, progress[2+i])
	}

	names, status, messages := sanityTable(t, res.stdout)
	assert.Equal(t, sanity.Checks(), names)
	for _, name := range names {
		want := "passed"
		if name == "list-and-watch/update" {
			want = "skipped"
		}
		assert.Equal(t, want, status[name], "%s: %q", name, messages[name])
	}
	assert.Equal(t, []string{"the configuration has no TriggerUpdate"}, messages["list-and-watch/update"])
	assert.Contains(t, res.stdout, "Checked example.com/gpu, registered in "+dir+" on endpoint example.com-gpu.sock\n")
	assert.True(t, strings.HasSuffix(res.stdout, fmt.Sprintf("\n%d passed, 0 failed, 1 skipped\n", len(names)-1)), res.stdout)
}

// A plugin whose Allocate answers a relative mount path fails the checks of
// Allocate responses, says so in the table and in the JUnit file, and the
// command exits 1.
func TestSanityCommandBrokenPlugin(t *testing.T) {
	dir := shortTempDir(t)
	startNodePlugin(t, dir, nil, func(r *pluginapi.AllocateResponse) {
		r.ContainerResponses[0].Mounts[0].ContainerPath = "run/gpu"
	})
	junit := filepath.Join(dir, "sanity.xml")
	res := devmgr(t, "", "sanity", "--quiet", "--socket-dir", dir, "--junit", junit, "--register-timeout", "10s", "--reregister-timeout", "10s")
	require.Equal(t, exitFailure, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	assert.Equal(t, fmt.Sprintf("devmgr: 2 of %d checks failed\n", len(sanity.Checks())), res.stderr)

	const mountMsg = `mounts with absolute paths: Mount{ContainerPath: "run/gpu", HostPath: "/host/run/plugintest/example.com_gpu/gpu-0"}`
	names, status, messages := sanityTable(t, res.stdout)
	assert.Equal(t, sanity.Checks(), names)
	var failed []string
	for _, name := range names {
		if status[name] == "failed" {
			failed = append(failed, name)
		}
	}
	assert.Equal(t, []string{"allocate/mounts", "concurrency/allocate"}, failed)
	assert.Equal(t, []string{mountMsg}, messages["allocate/mounts"])
	assert.Contains(t, res.stdout, "\nallocate/mounts ")
	assert.Contains(t, res.stdout, "\n    "+mountMsg+"\n")

	b, err := os.ReadFile(junit)
	require.NoError(t, err)
	var suite struct {
		XMLName  xml.Name `xml:"testsuite"`
		Name     string   `xml:"name,attr"`
		Tests    int      `xml:"tests,attr"`
		Failures int      `xml:"failures,attr"`
		Skipped  int      `xml:"skipped,attr"`
		Cases    []struct {
			ClassName string `xml:"classname,attr"`
			Name      string `xml:"name,attr"`
			Time      string `xml:"time,attr"`
			Failure   *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
		} `xml:"testcase"`
	}
	require.NoError(t, xml.Unmarshal(b, &suite), "%s", b)
	assert.Equal(t, "devmgr sanity", suite.Name)
	assert.Equal(t, []int{len(sanity.Checks()), 2, 1}, []int{suite.Tests, suite.Failures, suite.Skipped})
	require.Len(t, suite.Cases, len(sanity.Checks()))
	var junitFailed []string
	for i, c := range suite.Cases {
		assert.Equal(t, sanity.Checks()[i], c.ClassName+"/"+c.Name)
		assert.Regexp(t, `^\d+\.\d{3}$`, c.Time)
		if c.Failure != nil {
			junitFailed = append(junitFailed, c.ClassName+"/"+c.Name)
		}
		if c.ClassName+"/"+c.Name == "allocate/mounts" {
			require.NotNil(t, c.Failure)
			assert.Equal(t, mountMsg, c.Failure.Message)
			assert.Equal(t, mountMsg, c.Failure.Text)
		}
		if c.ClassName+"/"+c.Name == "list-and-watch/update" {
			require.NotNil(t, c.Skipped)
			assert.Equal(t, "the configuration has no TriggerUpdate", c.Skipped.Message)
		}
	}
	assert.Equal(t, failed, junitFailed)
}

// --skip skips the checks it matches; skipped checks do not fail the run.
func TestSanityCommandSkip(t *testing.T) {
	dir := shortTempDir(t)
	startNodePlugin(t, dir, nil, nil)
	res := devmgr(t, "", "sanity", "--socket-dir", dir, "--skip", "^(restart|allocate)/", "--register-timeout", "10s")
	require.Equal(t, exitOK, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	names, status, messages := sanityTable(t, res.stdout)
	var skipped []string
	for _, name := range names {
		if status[name] == "skipped" {
			skipped = append(skipped, name)
			continue
		}
		assert.Equal(t, "passed", status[name], "%s: %q", name, messages[name])
	}
	assert.Equal(t, []string{"list-and-watch/update", "allocate/responses", "allocate/device-specs", "allocate/envs",
		"allocate/cdi", "allocate/mounts", "allocate/unknown-device", "restart/re-register"}, skipped)
	assert.Equal(t, []string{"skipped by the configuration"}, messages["restart/re-register"])
	assert.True(t, strings.HasSuffix(res.stdout, fmt.Sprintf("\n%d passed, 0 failed, 8 skipped\n", len(names)-8)), res.stdout)
}

// Without a plugin the command exits 4 once --register-timeout passes; a
// --skip that is no regular expression is a usage error.
func TestSanityCommandExitCodes(t *testing.T) {
	dir := shortTempDir(t)
	junit := filepath.Join(dir, "sanity.xml")
	res := devmgr(t, "", "sanity", "--quiet", "--socket-dir", dir, "--register-timeout", "300ms", "--junit", junit)
	assert.Equal(t, exitNotFound, res.code, res.stderr)
	assert.Equal(t, "devmgr: sanity: a device plugin did not register in "+dir+" within 300ms\n", res.stderr)
	assert.Empty(t, res.stdout)
	_, err := os.Stat(filepath.Join(dir, "kubelet.sock"))
	assert.ErrorIs(t, err, os.ErrNotExist, "kubelet.sock removed at the end")
	b, err := os.ReadFile(junit)
	require.NoError(t, err, "the JUnit file says why nothing was checked")
	var suite junitSuite
	require.NoError(t, xml.Unmarshal(b, &suite))
	require.Len(t, suite.Cases, 1)
	assert.Equal(t, 1, suite.Failures)
	assert.Equal(t, "setup", suite.Cases[0].Name)
	require.NotNil(t, suite.Cases[0].Failure)
	assert.Contains(t, suite.Cases[0].Failure.Message, "did not register")

	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"--socket-dir", dir, "--skip", "allocate/("}, "devmgr: --skip: error parsing regexp: missing closing ): `allocate/(`\n"},
		{[]string{"--socket-dir", dir, "--register-timeout", "0s"}, "devmgr: --register-timeout must be positive, not 0s\n"},
		{[]string{"--skip", "x"}, "devmgr: required flag(s) \"socket-dir\" not set\n"},
		{[]string{"--socket-dir", dir, "--call-timeout", "-1s"}, "devmgr: --call-timeout must be positive, not -1s\n"},
		{[]string{"--socket-dir", dir, "--max-devices-per-container", "0"}, "devmgr: --max-devices-per-container must be at least 1, not 0\n"},
		{[]string{"--socket-dir", dir, "--prestart-timeout", "0s"}, "devmgr: --prestart-timeout must be positive, not 0s\n"},
		{[]string{"--socket-dir", dir, "--parallel", "0"}, "devmgr: --parallel must be at least 1, not 0\n"},
		{[]string{"--socket-dir", dir, "--numa-nodes", "0,64"}, "devmgr: --numa-nodes: node 64 out of range 0-63\n"},
	} {
		res := devmgr(t, "", append([]string{"sanity"}, tc.args...)...)
		assert.Equal(t, exitUsage, res.code, res.stderr)
		assert.Equal(t, tc.stderr, res.stderr)
	}
}

// The timeout, concurrency, device and NUMA flags reach the suite's
// configuration.
func TestSanityFlagsReachTheConfig(t *testing.T) {
	o := &sanityOptions{socketDir: "/tmp/dp", registerTimeout: time.Second, reregisterTimeout: 2 * time.Second,
		listTimeout: 3 * time.Second, callTimeout: 4 * time.Second, preStartTimeout: 5 * time.Second,
		parallel: 3, maxDevices: 1, numaNodes: []int{0, 2}}
	cfg, err := o.config()
	require.NoError(t, err)
	assert.Equal(t, []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 5 * time.Second},
		[]time.Duration{cfg.RegisterTimeout, cfg.ReregisterTimeout, cfg.ListTimeout, cfg.CallTimeout, cfg.PreStartTimeout})
	assert.Equal(t, 3, cfg.Parallel)
	assert.Equal(t, 1, cfg.MaxDevicesPerContainer)
	assert.Equal(t, []int{0, 2}, cfg.NUMANodes)
	assert.Nil(t, cfg.PodInfo, "no pod in the calls unless asked")

	o.podInfo = true
	cfg, err = o.config()
	require.NoError(t, err)
	require.NotNil(t, cfg.PodInfo)
	assert.Equal(t, "sanity-pod", cfg.PodInfo.Name)
}

// A plugin that reports the NUMA nodes of the machine it will run on is
// checked against the nodes --numa-nodes names: device topology on node 3
// passes with --numa-nodes 0,3 and fails with --numa-nodes 0,1.
func TestSanityCommandNUMANodes(t *testing.T) {
	on := func(id string, node int64) *pluginapi.Device {
		return &pluginapi.Device{ID: id, Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: node}}}}
	}
	for _, tc := range []struct {
		nodes, status string
		messages      []string
	}{
		{"0,3", "passed", nil},
		{"0,1", "failed", []string{`topology names NUMA nodes of this machine: list 1: device "gpu-3" names NUMA node 3; this machine has [0 1]`}},
	} {
		t.Run(tc.nodes, func(t *testing.T) {
			dir := shortTempDir(t)
			startNodePlugin(t, dir, []*pluginapi.Device{on("gpu-0", 0), on("gpu-3", 3)}, nil)
			res := devmgr(t, "", "sanity", "--socket-dir", dir, "--numa-nodes", tc.nodes, "--skip", "^(restart|allocate|concurrency)/",
				"--register-timeout", "10s")
			_, status, messages := sanityTable(t, res.stdout)
			assert.Equal(t, tc.status, status["list-and-watch/topology"], res.stdout)
			assert.Equal(t, tc.messages, messages["list-and-watch/topology"])
			for name, st := range status {
				if name != "list-and-watch/topology" && st == "failed" {
					t.Errorf("%s failed: %q", name, messages[name])
				}
			}
		})
	}
}

// The help names every check, in the order they run, for --skip.
func TestSanityHelpListsTheChecks(t *testing.T) {
	res := devmgr(t, "", "sanity", "--help")
	require.Equal(t, exitOK, res.code, res.stderr)
	_, list, found := strings.Cut(res.stdout, "The checks, in the order they run (the names --skip matches):\n")
	require.True(t, found, res.stdout)
	list, _, _ = strings.Cut(list, "\n\n")
	assert.Equal(t, sanity.Checks(), strings.Fields(list))
}

// --quiet says nothing while the checks run, and --json prints the report as
// one document.
func TestSanityCommandQuietAndJSON(t *testing.T) {
	dir := shortTempDir(t)
	startNodePlugin(t, dir, nil, nil)
	res := devmgr(t, "", "sanity", "--socket-dir", dir, "--register-timeout", "10s", "--skip", "^restart/", "--quiet", "--json")
	require.Equal(t, exitOK, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	assert.Empty(t, res.stderr)
	var rep struct {
		Resource, Endpoint string
		Results            []struct{ Name, Status, Duration string }
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &rep), res.stdout)
	assert.Equal(t, "example.com/gpu", rep.Resource)
	require.Len(t, rep.Results, len(sanity.Checks()))
	for i, r := range rep.Results {
		assert.Equal(t, sanity.Checks()[i], r.Name)
		want := "passed"
		if strings.HasPrefix(r.Name, "restart/") || r.Name == "list-and-watch/update" {
			want = "skipped"
		}
		assert.Equal(t, want, r.Status, r.Name)
	}
}
