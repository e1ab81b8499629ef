//go:build reliability

package reliability

// Crash consistency through `devmgr serve`, the way an operator runs it: the
// devmgr binary serves a plugin (plugintest, in this process) and admits and
// releases pods through its control API; the test kills it with SIGKILL at a
// random moment, with the checkpoint directory on disk or (for power loss)
// on LazyFS with the unsynced data dropped after the kill, and starts it
// again on the same directories. As soon as the new serve answers:
//
//   - GET /v1/status counts as allocated exactly the devices the pods of
//     GET /v1/pods hold (what the checkpoint holds for a pod whose admission
//     was never acknowledged is released before the first answer);
//   - every acknowledged admission not released since is listed, with its
//     devices, and is in the checkpoint with them; every acknowledged
//     release is gone from the list;
//   - the request in flight at the kill (admission or release) either
//     landed or did not: both are allowed, and what the list says is taken;
//   - no device is held by two pods, in the list or in the checkpoint, and
//     the checkpoint holds no pod that was never admitted;
//   - no temporary file is left: serve's start removed them.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
)

const (
	// servePodsFile is serve's file of admitted pods, in its checkpoint
	// directory (not a temporary file, though its name starts with ".").
	servePodsFile = ".devmgr-serve-pods.json"
	// serveMaxActive pods of one or two devices always leave room among
	// crashDevices for the next admission.
	serveMaxActive = 6
	// serveKillWindow bounds the random time serve admits before its kill.
	serveKillWindow = 100 * time.Millisecond
	// Figure categories.
	categoryServeKill      = "devmgr serve: SIGKILL"
	categoryServePowerLoss = "devmgr serve: power loss (LazyFS)"
)

func TestServeCrashConsistency(t *testing.T) {
	runServeCrash(t, *serveKills, nil)
}

func TestServePowerLossConsistency(t *testing.T) {
	lz := mountLazyFS(t, categoryServePowerLoss)
	runServeCrash(t, *serveKills, lz)
}

// The devmgr binary, built once by the first test that needs it, in a
// directory TestMain removes.
var (
	devmgrOnce sync.Once
	devmgrDir  string
	devmgrPath string
	devmgrErr  error
)

func devmgrBinary(t *testing.T) string {
	t.Helper()
	devmgrOnce.Do(func() {
		if devmgrDir, devmgrErr = os.MkdirTemp("", "rlbin"); devmgrErr != nil {
			return
		}
		p := filepath.Join(devmgrDir, "devmgr")
		out, err := exec.Command("go", "build", "-o", p, "github.com/openkubelet/devmgr/cmd/devmgr").CombinedOutput()
		if err != nil {
			devmgrErr = fmt.Errorf("go build ./cmd/devmgr: %w\n%s", err, out)
			return
		}
		devmgrPath = p
	})
	require.NoError(t, devmgrErr)
	return devmgrPath
}

// removeDevmgrBinary removes what devmgrBinary built.
func removeDevmgrBinary() {
	if devmgrDir != "" {
		_ = os.RemoveAll(devmgrDir)
	}
}

// serveStats are the figures of the serve categories.
type serveStats struct {
	kills, startupKills int
	lossCounts
	acked, releases                               int
	inflightAdmitted, inflightNotAdmitted         int // admissions in flight at a kill: listed after the restart or not
	inflightReleased, inflightNotReleased         int // releases in flight at a kill
	checks                                        int // restarts checked
	statusMismatches                              int
	lost, doubled, unexpected, undecoded, refused int
	startupTotal                                  time.Duration
	startups                                      int
}

func (st *serveStats) failures() int {
	return st.statusMismatches + st.lost + st.doubled + st.unexpected + st.undecoded + st.refused + st.tempAfterStart
}

// serveDirs are the paths one serve runs on, again after each kill.
type serveDirs struct {
	sockets, ckpt, ctl, log string
}

// runServeCrash kills n serve processes, one after the other, on the same
// directories (the checkpoint directory on lz, when not nil, with a power
// loss after each kill), checks each restart, and records the figures.
func runServeCrash(t *testing.T, n int, lz *lazyFS) {
	fig := Figures{Category: categoryServeKill}
	if lz != nil {
		fig.Category = categoryServePowerLoss
	}
	defer recordOnExit(t, &fig, time.Now())
	bin := devmgrBinary(t)
	seed := suiteSeed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	base := shortDir(t)
	dirs := serveDirs{
		sockets: filepath.Join(base, "s"),
		ckpt:    filepath.Join(base, "ck"),
		ctl:     filepath.Join(base, "ctl.sock"),
		log:     filepath.Join(base, "serve.log"),
	}
	if lz != nil {
		dirs.ckpt = lz.mnt
	}
	m := &serveModel{held: map[string][]string{}, gone: sets.New[string]()}
	var st serveStats
	var pending *serveInflight
	for k := 0; k < n && st.failures() <= 20; k++ {
		p := launchServe(t, bin, dirs)
		if k%8 == 7 && st.startups > 0 {
			// The kill moment is random on purpose: this timer is the
			// fault, not a wait for something to happen.
			timer := time.NewTimer(time.Duration(rng.Int64N(int64(st.startupTotal)/int64(st.startups) + 1)))
			select {
			case <-timer.C:
			case <-p.exited:
			}
			timer.Stop()
			st.startupKills++
		} else {
			api, status := p.waitAnswer(t)
			st.startupTotal += time.Since(p.started)
			st.startups++
			m.check(t, k, api, status, dirs.ckpt, pending, &st)
			plugin := startServePlugin(t, api, dirs.sockets)
			pending = m.drive(t, k, p, api, rng, &st)
			plugin.Stop()
		}
		p.kill(t)
		st.kills++
		st.afterKill(t, k, lz, func(event string, total, most *int) int {
			return countServeTemps(t, dirs.ckpt, k, event, total, most)
		})
	}
	// The last kill's restart.
	p := launchServe(t, bin, dirs)
	api, status := p.waitAnswer(t)
	m.check(t, n, api, status, dirs.ckpt, pending, &st)
	p.kill(t)

	fig.Cases, fig.Faults, fig.Kills, fig.Lost, fig.Doubled = st.kills, st.kills, st.kills, st.lost, st.doubled
	assert.Zero(t, st.lost, "acknowledged admissions lost")
	assert.Zero(t, st.doubled, "devices held by two pods")
	floor, rareFloor := 0, 0
	if n >= 20 { // with fewer kills, these may be 0 by chance
		floor = 1
	}
	if n >= 50 {
		rareFloor = 1
	}
	fig.param("seed", seed)
	fig.param("kill window after the plugin registered", serveKillWindow.String())
	fig.exact(t, "serve processes that died of SIGKILL", st.kills, n)
	fig.exact(t, "restarts checked (status, pods, checkpoint) as soon as serve answered", st.checks, n-st.startupKills+1)
	fig.exact(t, "restarts whose status counted other devices allocated than the pods hold", st.statusMismatches, 0)
	fig.atLeast(t, "acknowledged admissions", st.acked, floor)
	fig.atLeast(t, "acknowledged releases", st.releases, floor)
	fig.atLeast(t, "kills during serve's start-up", st.startupKills, floor)
	// Each kill after the plugin registered cut one request, found landed
	// or not at the next restart; the rare outcomes are asserted through
	// the sum.
	cut := st.inflightAdmitted + st.inflightNotAdmitted + st.inflightReleased + st.inflightNotReleased
	assert.Equal(t, n-st.startupKills, cut, "kills after the plugin registered: each cut a request")
	inSum := fmt.Sprintf("with the other outcomes of a request in flight, sum = %d kills after registration", n-st.startupKills)
	fig.atLeast(t, "kills with an admission in flight, not listed after the restart", st.inflightNotAdmitted, floor)
	fig.detail("kills with an admission in flight, listed after the restart", st.inflightAdmitted, inSum)
	fig.atLeast(t, "kills with a release in flight, not done after the restart", st.inflightNotReleased, rareFloor)
	fig.detail("kills with a release in flight, done after the restart", st.inflightReleased, inSum)
	fig.exact(t, "unexpected pods, listed or in the checkpoint", st.unexpected, 0)
	fig.exact(t, "checkpoints that did not verify", st.undecoded, 0)
	fig.exact(t, "admissions or releases refused", st.refused, 0)
	fig.atLeast(t, "temporary files found right after a kill (total)", st.tempAfterKill, rareFloor)
	fig.atMost(t, "temporary files of one file (checkpoint or pod file) right after one kill (most)", st.maxTempAfterKill, 1)
	fig.exact(t, "temporary files left after serve started again", st.tempAfterStart, 0)
	if lz != nil {
		st.recordLosses(t, &fig, st.kills, "temporary files of one file (checkpoint or pod file) right after one power loss (most)")
	}
}

// countServeTemps counts the temporary files in serve's checkpoint
// directory after event (a kill or a power loss), adds them to *total, and
// the most of one file's to *most. Serve writes two files, the checkpoint
// and its pod file, each by its own writer (a device update's checkpoint
// write can run beside a release's pod-file write): a kill interrupts at
// most one write of each. Any other hidden file fails the test.
func countServeTemps(t *testing.T, dir string, k int, event string, total, most *int) int {
	t.Helper()
	names := tempNames(t, dir, servePodsFile)
	var ckpt, pods int
	for _, name := range names {
		switch {
		case strings.HasPrefix(name, servePodsFile+".tmp-"):
			pods++
		case len(name) > 1 && strings.Trim(name[1:], "0123456789") == "":
			ckpt++
		default:
			t.Errorf("kill %d: after %s, %s in the checkpoint directory is no temporary file serve writes", k, event, name)
		}
	}
	if ckpt > 1 || pods > 1 {
		t.Errorf("kill %d: temporary files right after %s: %v; one write of each file was interrupted at most", k, event, names)
	}
	*total += len(names)
	*most = max(*most, ckpt, pods)
	return len(names)
}

// serveProc is a running devmgr serve.
type serveProc struct {
	cmd     *exec.Cmd
	dirs    serveDirs
	started time.Time
	exited  chan struct{} // closed once the process is reaped
	err     error         // Wait's error, set before exited is closed
}

// launchServe starts devmgr serve on dirs, its output to dirs.log (the last
// process's output only). It dies with this process, and is killed when the
// test ends if it still runs.
func launchServe(t *testing.T, bin string, dirs serveDirs) *serveProc {
	t.Helper()
	out, err := os.Create(dirs.log)
	require.NoError(t, err)
	defer out.Close()
	p := &serveProc{dirs: dirs, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, "serve", "--socket-dir", dirs.sockets, "--checkpoint-dir", dirs.ckpt,
		"--control-socket", dirs.ctl, "--numa-nodes", "0", "--kubeconfig=") // never the caller's cluster ($KUBECONFIG)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.started = time.Now()
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// log returns the end of serve's output.
func (p *serveProc) log() string {
	b, _ := os.ReadFile(p.dirs.log)
	return "devmgr serve output:\n" + string(b[max(0, len(b)-16<<10):])
}

// kill sends SIGKILL, waits for the process to end and requires that it died
// of that signal.
func (p *serveProc) kill(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	select {
	case <-p.exited:
	case <-timer.C:
		require.FailNow(t, "devmgr serve survived SIGKILL")
	}
	require.True(t, killedBySIGKILL(p.err), "devmgr serve did not die of SIGKILL: %v\n%s", p.err, p.log())
}

// waitAnswer waits until the control API answers GET /v1/status and returns
// a client and that first answer.
func (p *serveProc) waitAnswer(t *testing.T) (*serveAPI, serveStatus) {
	t.Helper()
	api := newServeAPI(p.dirs.ctl)
	var status serveStatus
	err := pollUntil(waitLimit, func() bool {
		select {
		case <-p.exited:
			return true
		default:
		}
		code, err := api.do(http.MethodGet, "/v1/status", nil, &status)
		return err == nil && code == http.StatusOK
	})
	require.NoError(t, err, "devmgr serve did not answer\n%s", p.log())
	select {
	case <-p.exited:
		require.FailNow(t, "devmgr serve exited at start", "%v\n%s", p.err, p.log())
	default:
	}
	return api, status
}

// serveAPI is a client of serve's control API.
type serveAPI struct{ c *http.Client }

func newServeAPI(ctl string) *serveAPI {
	return &serveAPI{c: &http.Client{
		Timeout: waitLimit,
		Transport: &http.Transport{
			// One connection per request: no idle connection outlives a
			// test, and none reaches a killed serve.
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", ctl)
			},
		},
	}}
}

// do sends a request and decodes a 200 answer into out. An error means the
// outcome is unknown (no complete answer).
func (a *serveAPI) do(method, path string, body []byte, out any) (int, error) {
	req, err := http.NewRequest(method, "http://devmgr"+path, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp, err := a.c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return 0, fmt.Errorf("%s %s: %w: %s", method, path, err, b)
		}
	}
	return resp.StatusCode, nil
}

// The parts of the control API's answers the test reads.
type (
	serveStatus struct {
		Resources []struct {
			Name                             string
			Capacity, Allocatable, Allocated int
		}
	}
	serveContainer struct {
		Name    string
		Devices map[string][]string
	}
	servePods struct {
		Pods []struct {
			UID        string
			Containers []serveContainer
		}
	}
	serveAdmission struct {
		Containers []serveContainer
	}
)

// allocated returns the devices of nodeResource status counts as allocated.
func (s serveStatus) allocated() int {
	n := 0
	for _, r := range s.Resources {
		if r.Name == nodeResource {
			n += r.Allocated
		}
	}
	return n
}

// devicesOfContainers returns the sorted devices of nodeResource the
// container nodeContainer holds.
func devicesOfContainers(cs []serveContainer) []string {
	for _, c := range cs {
		if c.Name == nodeContainer {
			return sortedDevices(slices.Clone(c.Devices[nodeResource]))
		}
	}
	return nil
}

// startServePlugin starts a plugin of crashDevices devices of nodeResource,
// registers it with serve and waits until serve reports them all healthy.
// The caller stops it.
func startServePlugin(t *testing.T, api *serveAPI, sockets string) *plugintest.Plugin {
	t.Helper()
	devs := make([]*pluginapi.Device, crashDevices)
	for i := range devs {
		devs[i] = &pluginapi.Device{ID: fmt.Sprintf("dev-%02d", i), Health: pluginapi.Healthy}
	}
	p, err := plugintest.New(plugintest.Options{ResourceName: nodeResource, SocketDir: sockets, Devices: devs, Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	require.NoError(t, p.Start())
	require.NoError(t, p.Register(filepath.Join(sockets, devicemanager.KubeletSocketName)))
	var status serveStatus
	err = pollUntil(waitLimit, func() bool {
		if _, err := api.do(http.MethodGet, "/v1/status", nil, &status); err != nil {
			return false
		}
		for _, r := range status.Resources {
			if r.Name == nodeResource && r.Capacity == crashDevices && r.Allocatable == crashDevices {
				return true
			}
		}
		return false
	})
	require.NoError(t, err, "serve does not report the plugin's %d devices: %+v", crashDevices, status)
	return p
}

// serveModel is what the test knows serve must hold.
type serveModel struct {
	// held are the pods serve must list, with their devices: acknowledged
	// admissions, not released since.
	held map[string][]string
	// gone are pods acknowledged released, or in flight at a kill and not
	// listed after it: the checkpoint may still hold them.
	gone sets.Set[string]
}

// serveInflight is a request sent and not answered when serve died.
type serveInflight struct {
	uid     string
	release bool
}

func (m *serveModel) active() []string {
	uids := make([]string, 0, len(m.held))
	for uid := range m.held {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	return uids
}

// drive admits and releases pods through api, one request at a time, until
// serve dies: SIGKILL comes at a random moment up to serveKillWindow from
// now. It returns the request in flight at the kill.
func (m *serveModel) drive(t *testing.T, k int, p *serveProc, api *serveAPI, rng *rand.Rand, st *serveStats) *serveInflight {
	t.Helper()
	fired := make(chan struct{})
	// The kill moment is random on purpose: this timer is the fault.
	timer := time.AfterFunc(time.Duration(rng.Int64N(int64(serveKillWindow)+1)), func() {
		defer close(fired)
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	})
	defer func() {
		if !timer.Stop() {
			<-fired
		}
	}()
	deadline := time.Now().Add(waitLimit)
	for i := 0; time.Now().Before(deadline); i++ {
		if uids := m.active(); len(uids) >= serveMaxActive || len(uids) > 0 && rng.IntN(4) == 0 {
			uid := uids[rng.IntN(len(uids))]
			code, err := api.do(http.MethodDelete, "/v1/pods/"+uid, nil, nil)
			if code != 0 && err != nil {
				t.Errorf("kill %d: release of %s refused: %v", k, uid, err)
				st.refused++
			}
			if err != nil {
				return &serveInflight{uid: uid, release: true}
			}
			delete(m.held, uid)
			m.gone.Insert(uid)
			st.releases++
		}
		uid := fmt.Sprintf("s%d-%d", k, i)
		var a serveAdmission
		code, err := api.do(http.MethodPost, "/v1/pods", servePod(t, uid, 1+rng.IntN(2)), &a)
		if code != 0 && err != nil {
			t.Errorf("kill %d: admission of %s refused: %v", k, uid, err)
			st.refused++
		}
		if err != nil {
			return &serveInflight{uid: uid}
		}
		devs := devicesOfContainers(a.Containers)
		if d := doubledDevices(m.held, uid, devs); d > 0 {
			t.Errorf("kill %d: serve gave %s devices %v, %d of them held by another pod", k, uid, devs, d)
			st.doubled += d
		}
		m.held[uid] = devs
		st.acked++
	}
	require.FailNow(t, "devmgr serve still answers", "kill %d: %v after its kill was due", k, waitLimit)
	return nil
}

// servePod returns the JSON of a pod whose container nodeContainer asks for
// count devices of nodeResource.
func servePod(t *testing.T, uid string, count int) []byte {
	t.Helper()
	b, err := json.Marshal(nodePod(uid, count))
	require.NoError(t, err)
	return b
}

// check checks a restarted serve, given its first status answer, against the
// model, after taking in what became of the request in flight (fl) at the
// kill.
func (m *serveModel) check(t *testing.T, k int, api *serveAPI, status serveStatus, ckpt string, fl *serveInflight, st *serveStats) {
	t.Helper()
	st.checks++
	var pods servePods
	_, err := api.do(http.MethodGet, "/v1/pods", nil, &pods)
	require.NoError(t, err, "restart after kill %d", k)
	listed := map[string][]string{}
	held := 0
	for _, p := range pods.Pods {
		listed[p.UID] = devicesOfContainers(p.Containers)
		held += len(listed[p.UID])
	}
	if got := status.allocated(); got != held {
		t.Errorf("restart after kill %d: GET /v1/status counts %d devices allocated, the pods of GET /v1/pods hold %d: %v",
			k, got, held, listed)
		st.statusMismatches++
	}
	if fl != nil {
		devs, ok := listed[fl.uid]
		switch {
		case fl.release && ok:
			st.inflightNotReleased++
		case fl.release:
			delete(m.held, fl.uid)
			m.gone.Insert(fl.uid)
			st.inflightReleased++
		case ok:
			m.held[fl.uid] = devs
			st.inflightAdmitted++
		default:
			m.gone.Insert(fl.uid)
			st.inflightNotAdmitted++
		}
	}
	if d := doubledAmong(listed); d > 0 {
		t.Errorf("restart after kill %d: %d devices held by two listed pods: %v", k, d, listed)
		st.doubled += d
	}
	file, err := readAllocations(ckpt)
	if err != nil {
		t.Errorf("restart after kill %d: %v", k, err)
		st.undecoded++
		file = nil
	}
	if d := doubledAmong(file); d > 0 {
		t.Errorf("restart after kill %d: %d devices held by two pods in the checkpoint: %v", k, d, file)
		st.doubled += d
	}
	for uid, want := range m.held {
		got, ok := listed[uid]
		inFile, fileOK := file[uid]
		if !ok || !slices.Equal(got, want) || !fileOK || !slices.Equal(inFile, want) {
			t.Errorf("restart after kill %d: acknowledged pod %s with devices %v: listed %v, in the checkpoint %v", k, uid, want, got, inFile)
			st.lost++
		}
	}
	for uid, devs := range listed {
		if _, ok := m.held[uid]; !ok {
			t.Errorf("restart after kill %d: serve lists %s (%v), which was never acknowledged nor in flight, or was released", k, uid, devs)
			st.unexpected++
		}
	}
	for uid, devs := range file {
		if _, ok := m.held[uid]; !ok && !m.gone.Has(uid) {
			t.Errorf("restart after kill %d: the checkpoint holds %s (%v), which was never admitted", k, uid, devs)
			st.unexpected++
		}
	}
	if left := tempFiles(t, ckpt, servePodsFile); left > 0 {
		t.Errorf("restart after kill %d: %d temporary files left after serve started", k, left)
		st.tempAfterStart += left
	}
}
