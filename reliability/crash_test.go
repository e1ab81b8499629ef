//go:build reliability

package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
)

// Crash consistency: a child process admits and releases pods on a manager
// whose checkpoint lives in a directory that outlives it; the parent kills it
// with SIGKILL at a random moment, then reads the checkpoint and starts a new
// manager on it. What the checkpoint may hold after a kill:
//
//   - every admission the child acknowledged (Allocate returned nil, so the
//     checkpoint was on disk) with exactly the devices it reported;
//   - plus, possibly, the admission in flight at the kill (its write may have
//     landed before the acknowledgement was printed);
//   - and pods the child released: garbage collection does not write the
//     checkpoint (in devmgr as in the kubelet), so a release reaches the
//     file only with the next admission's write, which garbage-collects
//     first. A released pod
//     stays in the file until an admission started after its release is
//     written, and is gone from it from then on.
//
// Two more writes can carry a garbage collection: a device update writes the
// ledger as it is. The child's Start releases the pods released before it
// began (it starts with the others active), and the plugin sends one device
// list, when it registers after the child starts. That write may land before
// the first acknowledged admission of the run: the file then holds the
// acknowledged pods without those released before the child began. It may
// also land after the first admission's garbage collection and before its
// record: the file then holds the acknowledged pods without any released
// one, and not the pod in flight. Both states are allowed until the first
// acknowledged admission of a run.
//
// Nothing else: an acknowledged pod missing or with other devices is lost; a
// device in two pods is doubled.
//
// This file also holds the helpers damage_test.go and perm_test.go share: a
// node (a manager and a plugintest plugin in one directory) and child roles.

func init() {
	children[roleCrashAdmitter] = crashAdmitter
}

const (
	roleCrashAdmitter = "crash-admitter"
	// Environment of the crash-admitter role.
	envCrashDir    = "DEVMGR_CRASH_DIR"    // socket directory
	envCrashCkpt   = "DEVMGR_CRASH_CKPT"   // checkpoint directory
	envCrashRun    = "DEVMGR_CRASH_RUN"    // run number: names the pods admitted
	envCrashActive = "DEVMGR_CRASH_ACTIVE" // comma-separated UIDs of the active pods at start
	envCrashSeed   = "DEVMGR_CRASH_SEED"

	// crashDevices is the number of devices the child's plugin serves;
	// crashMaxActive active pods of one or two devices each always leave
	// room for the next admission.
	crashDevices   = 16
	crashMaxActive = 6
	// crashKillWindow bounds the random time a child admits before its kill.
	crashKillWindow = 50 * time.Millisecond
	// crashChildLifetime bounds a child nobody kills (an orphaned one).
	crashChildLifetime = 30 * time.Second
	// childTimeout bounds every wait for a child process.
	childTimeout = 60 * time.Second
)

// Lines the crash-admitter prints, each with one write before it goes on.
const (
	crashReady   = "READY"   // the manager started and the plugin's devices are seen
	crashRelease = "RELEASE" // RELEASE uid: uid was dropped from the active pods
	crashBegin   = "BEGIN"   // BEGIN uid n: Allocate of n devices for uid is being called
	crashAck     = "ACK"     // ACK uid dev,dev: Allocate returned nil; the devices held
)

// crashAdmitter is the child of TestCrashConsistency: it starts a manager and
// a plugin in its directory, then admits pods (and releases some) until it is
// killed, acknowledging each admission on stdout before the next begins.
func crashAdmitter() int {
	dir, ckpt := os.Getenv(envCrashDir), os.Getenv(envCrashCkpt)
	run, err1 := strconv.ParseUint(os.Getenv(envCrashRun), 10, 64)
	seed, err2 := strconv.ParseUint(os.Getenv(envCrashSeed), 10, 64)
	if err := errors.Join(err1, err2); err != nil || dir == "" || ckpt == "" {
		fmt.Fprintf(os.Stderr, "crash-admitter: bad environment: %v\n", err)
		return 2
	}
	pods := newActivePods()
	for _, uid := range strings.Split(os.Getenv(envCrashActive), ",") {
		if uid != "" {
			pods.add(nodePod(uid, 1))
		}
	}
	n, err := startDMNode(devicemanager.Options{SocketDir: dir, CheckpointDir: ckpt, Logger: klog.Background()}, pods, crashDevices)
	if err != nil {
		fmt.Fprintf(os.Stderr, "crash-admitter: %v\n", err)
		return 3
	}
	defer n.stop()
	rng := rand.New(rand.NewPCG(seed, run))
	// os.Stdout is not buffered: each line is one write(2), in the file
	// before the next step begins.
	fmt.Println(crashReady)
	ready := os.NewFile(3, "ready")
	_, err = ready.Write([]byte{'\n'})
	if err := errors.Join(err, ready.Close()); err != nil {
		fmt.Fprintf(os.Stderr, "crash-admitter: %v\n", err)
		return 3
	}
	// The parent kills this process; the deadline only ends an orphan.
	end := time.Now().Add(crashChildLifetime)
	for i := 0; time.Now().Before(end); i++ {
		if uids := pods.uids(); len(uids) >= crashMaxActive || len(uids) > 0 && rng.IntN(4) == 0 {
			uid := uids[rng.IntN(len(uids))]
			pods.remove(types.UID(uid))
			fmt.Println(crashRelease, uid)
		}
		uid := fmt.Sprintf("k%d-%d", run, i)
		count := 1 + rng.IntN(2)
		fmt.Println(crashBegin, uid, count)
		devs, err := n.admit(nodePod(uid, count))
		if err != nil {
			fmt.Fprintf(os.Stderr, "crash-admitter: admit %s: %v\n", uid, err)
			return 4
		}
		fmt.Println(crashAck, uid, strings.Join(devs, ","))
	}
	fmt.Fprintln(os.Stderr, "crash-admitter: nobody killed me")
	return 5
}

// crashStats are the figures of TestCrashConsistency and
// TestPowerLossConsistency.
type crashStats struct {
	kills, startupKills int
	lossCounts
	acked, released                      int
	inflightKills                        int // kills with an admission begun and not acknowledged
	inflightKept, inflightGone           int
	gcByDeviceUpdate                     int // the first admission's garbage collection written by a device update
	startGCByDeviceUpdate                int // Start's garbage collection written by a device update
	asAcked                              int // checkpoints holding exactly the acknowledged pods
	releasedInFile, restarts             int
	lost, doubled, unexpected, undecoded int
	otherState                           int // checkpoints in neither allowed state
	admitTime                            time.Duration
	startupTotal                         time.Duration
	startups                             int
}

// failures is the number of checks failed so far.
func (st *crashStats) failures() int {
	return st.lost + st.doubled + st.unexpected + st.undecoded + st.otherState + st.tempAfterStart
}

func TestCrashConsistency(t *testing.T) {
	runCrash(t, *kills, nil)
}

// TestPowerLossConsistency is TestCrashConsistency with the checkpoint on
// LazyFS, and a power loss after every kill: what the child wrote and did
// not sync is gone before the parent looks. A checkpoint renamed into place
// before its data was synced reads empty or short then, and fails the test.
func TestPowerLossConsistency(t *testing.T) {
	lz := mountLazyFS(t, categoryPowerLoss)
	runCrash(t, *losses, lz)
}

// runCrash kills n crash-admitters, one after the other, on one socket
// directory and one checkpoint directory (on lz, when not nil, with a power
// loss after each kill), checks the checkpoint after each, and records the
// figures.
func runCrash(t *testing.T, n int, lz *lazyFS) {
	fig := Figures{Category: "crash consistency"}
	if lz != nil {
		fig.Category = categoryPowerLoss
	}
	defer recordOnExit(t, &fig, time.Now())
	seed := suiteSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	dir, logDir := shortDir(t), t.TempDir()
	ckpt := dir
	if lz != nil {
		ckpt = lz.mnt
	}
	model := &crashModel{held: map[string][]string{}, released: sets.New[string]()}
	var st crashStats
	for k := 0; k < n; k++ {
		lines := killChildAtRandom(t, dir, ckpt, logDir, k, model.active(), seed, rng, &st)
		st.afterKill(t, k, lz, func(event string, total, most *int) int {
			return countTemps(t, ckpt, k, event, total, most)
		})
		inflight := model.replay(t, k, lines, &st)
		if inflight != nil {
			st.inflightKills++
		}
		undecoded := st.undecoded
		file := model.verify(t, k, ckpt, inflight, &st)
		if lz != nil && st.undecoded > undecoded {
			t.Errorf("kill %d: after a power loss, a checkpoint that does not decode means a rename reached the disk before the data it names was synced", k)
		}
		verifyRestart(t, k, dir, ckpt, file, inflight, &st)
		if left := tempFiles(t, ckpt); left > 0 {
			t.Errorf("kill %d: %d temporary files left after the next Start, which must remove them", k, left)
			st.tempAfterStart += left
		}
		if st.failures() > 20 {
			t.Errorf("giving up after kill %d: too many failures", k)
			break
		}
	}
	fig.Cases, fig.Faults, fig.Kills, fig.Lost, fig.Doubled = st.kills, st.kills, st.kills, st.lost, st.doubled
	assert.Zero(t, st.lost, "acknowledged allocations lost")
	assert.Zero(t, st.doubled, "devices held by two pods")
	floor := 0
	if n >= 50 { // with fewer kills, these may be 0 by chance
		floor = 1
	}
	fig.param("seed", seed)
	fig.param("kill window after READY", crashKillWindow.String())
	fig.exact(t, "children that died of SIGKILL", st.kills, n)
	fig.exact(t, "restarted managers that restored the file", st.restarts, st.kills)
	fig.atLeast(t, "acknowledged admissions", st.acked, floor)
	fig.atLeast(t, "releases", st.released, floor)
	fig.atLeast(t, "kills during start-up (restore, registration)", st.startupKills, floor)
	fig.exact(t, "kills with an admission in flight (in the file, or not)", st.inflightKills, st.inflightKept+st.inflightGone)
	fig.atLeast(t, "kills with an admission in flight, in the file", st.inflightKept, floor)
	fig.atLeast(t, "kills with an admission in flight, not in the file", st.inflightGone, floor)
	fig.atLeast(t, "released pods still in the file at a kill", st.releasedInFile, floor)
	// Each kill leaves the file in one state; the rare ones are asserted
	// through the sum.
	states := st.asAcked + st.inflightKept + st.gcByDeviceUpdate + st.startGCByDeviceUpdate + st.otherState + st.undecoded
	assert.Equal(t, st.kills, states, "kills: each leaves the file in one of the states counted")
	inSum := fmt.Sprintf("with the other states of the file after a kill, sum = %d", st.kills)
	fig.atLeast(t, "kills that left the file as acknowledged", st.asAcked, floor)
	fig.detail("kills after a device update wrote the first admission's garbage collection", st.gcByDeviceUpdate, inSum)
	fig.detail("kills after a device update wrote Start's garbage collection", st.startGCByDeviceUpdate, inSum)
	fig.exact(t, "checkpoints in neither allowed state", st.otherState, 0)
	fig.exact(t, "checkpoints that did not verify", st.undecoded, 0)
	fig.exact(t, "unexpected pods in the file", st.unexpected, 0)
	fig.atLeast(t, "temporary files found right after a kill (total)", st.tempAfterKill, floor)
	fig.atMost(t, "temporary files found right after one kill (most)", st.maxTempAfterKill, 1)
	fig.exact(t, "temporary files left after the next Start", st.tempAfterStart, 0)
	if st.admitTime > 0 { // one machine's speed: in the test log, not the report
		t.Logf("admissions per second in a child (each writes the checkpoint): %.0f", float64(st.acked)/st.admitTime.Seconds())
	}
	if lz != nil {
		st.recordLosses(t, &fig, st.kills, "temporary files found right after one power loss (most)")
	}
}

// categoryPowerLoss names the figures of TestPowerLossConsistency.
const categoryPowerLoss = "power loss (LazyFS)"

// countTemps counts the temporary files in dir after event (a kill or a
// power loss), adds them to *total and to *most if more, and fails the test
// if there is more than one: a crash interrupts at most one write.
func countTemps(t *testing.T, dir string, k int, event string, total, most *int, keep ...string) int {
	t.Helper()
	names := tempNames(t, dir, keep...)
	n := len(names)
	if n > 1 {
		t.Errorf("kill %d: %d temporary files right after %s, %v; one write was interrupted at most", k, n, event, names)
	}
	*total += n
	*most = max(*most, n)
	return n
}

// killChildAtRandom runs one crash-admitter on dir and kills it with SIGKILL
// at a random moment: one run in eight during its start-up (restoring the
// checkpoint, registering the plugin, its first write), the others up to
// crashKillWindow after it is ready. It returns the lines the child printed.
func killChildAtRandom(t *testing.T, dir, ckpt, logDir string, k int, active []string, seed uint64, rng *rand.Rand, st *crashStats) []string {
	t.Helper()
	c, err := startCrashChild(logDir, []string{
		envCrashDir + "=" + dir,
		envCrashCkpt + "=" + ckpt,
		envCrashRun + "=" + strconv.Itoa(k),
		envCrashActive + "=" + strings.Join(active, ","),
		envCrashSeed + "=" + strconv.FormatUint(seed, 10),
	})
	require.NoError(t, err)
	defer c.kill()

	var delay time.Duration
	var readyAt time.Time
	if k%8 == 7 && st.startups > 0 {
		delay = time.Duration(rng.Int64N(int64(st.startupTotal)/int64(st.startups) + 1))
	} else {
		require.NoError(t, c.waitReady(childTimeout), "kill %d: the crash-admitter did not get ready\n%s", k, c.stderr())
		readyAt = time.Now()
		st.startupTotal += readyAt.Sub(c.started)
		st.startups++
		delay = time.Duration(rng.Int64N(int64(crashKillWindow) + 1))
	}
	// The kill moment is random on purpose: this timer is the fault, not a
	// wait for something to happen.
	timer := time.NewTimer(delay)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-c.done:
		require.Failf(t, "crash-admitter ended before its kill", "kill %d: %v\n%s", k, c.err, c.stderr())
	}
	killedAt := time.Now()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case <-c.done:
	case <-time.After(childTimeout):
		require.Failf(t, "crash-admitter survived SIGKILL", "kill %d", k)
	}
	if !killedBySIGKILL(c.err) {
		require.Failf(t, "crash-admitter was not killed by the signal", "kill %d: %v\n%s", k, c.err, c.stderr())
	}
	lines, err := c.lines()
	require.NoError(t, err)
	switch {
	case len(lines) == 0 || lines[0] != crashReady:
		st.startupKills++
	case !readyAt.IsZero():
		st.admitTime += killedAt.Sub(readyAt)
	}
	st.kills++
	return lines
}

// killedBySIGKILL reports whether a process whose Wait returned err died of
// SIGKILL.
func killedBySIGKILL(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// crashChild is a running crash-admitter. Its stdout and stderr are files,
// not pipes: a line written into a pipe wakes this process, Go runs its due
// timers when it wakes, and kills would then land just after the child's
// lines (its acknowledgements) rather than at random moments of its work. One
// byte on a pipe, the child's fd 3, says it is ready.
type crashChild struct {
	cmd              *exec.Cmd
	outPath, errPath string
	ready            *os.File // read end of the ready pipe
	started          time.Time
	done             chan struct{} // closed when the process has ended
	err              error         // Wait's error, set before done is closed
}

// startCrashChild starts a crash-admitter with env added to this process's
// environment; its output goes to files in logDir. It dies with its parent.
func startCrashChild(logDir string, env []string) (*crashChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	c := &crashChild{
		outPath: filepath.Join(logDir, "stdout"),
		errPath: filepath.Join(logDir, "stderr"),
		done:    make(chan struct{}),
	}
	out, err := os.Create(c.outPath)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	errOut, err := os.Create(c.errPath)
	if err != nil {
		return nil, err
	}
	defer errOut.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer w.Close() // the child has its copy; EOF on r once it ends
	c.ready = r
	c.cmd = exec.Command(exe)
	c.cmd.Env = append(append(os.Environ(), childEnv+"="+roleCrashAdmitter), env...)
	c.cmd.Stdout, c.cmd.Stderr = out, errOut
	c.cmd.ExtraFiles = []*os.File{w}
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c.started = time.Now()
	if err := c.cmd.Start(); err != nil {
		r.Close()
		return nil, err
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// waitReady waits up to timeout for the child's ready byte.
func (c *crashChild) waitReady(timeout time.Duration) error {
	if err := c.ready.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	var b [1]byte
	_, err := c.ready.Read(b[:])
	return err
}

// kill ends the child if it still runs, waits for it and closes the pipe.
func (c *crashChild) kill() {
	select {
	case <-c.done:
	default:
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	c.ready.Close()
}

// lines returns the complete lines of the child's stdout; a line it was
// killed while writing is not one.
func (c *crashChild) lines() ([]string, error) {
	b, err := os.ReadFile(c.outPath)
	if err != nil {
		return nil, err
	}
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		return strings.Split(string(b[:i]), "\n"), nil
	}
	return nil, nil
}

// stderr returns the start of the child's stderr.
func (c *crashChild) stderr() string {
	b, _ := os.ReadFile(c.errPath)
	return string(b[:min(len(b), 64<<10)])
}

// crashModel is what the parent knows the checkpoint must hold, from the
// lines of the children so far.
type crashModel struct {
	// held maps every pod the checkpoint must hold to its devices: the
	// acknowledged admissions, released pods included until a written
	// admission has garbage-collected them.
	held map[string][]string
	// released are the pods of held the child dropped from its active pods
	// since its last acknowledged admission.
	released sets.Set[string]
	// startGC is what a write holds that comes after the child's Start
	// garbage-collected the pods released before it began, and before its
	// first acknowledged admission (a device update writes the ledger as it
	// is); nil once the child acknowledged an admission.
	startGC map[string][]string
}

// inflight is an admission begun and not acknowledged when its child died.
type inflight struct {
	uid   string
	count int
	// first is set for the first admission of a child: a device update's
	// write may still come during it.
	first bool
	// next is what the checkpoint holds if the admission's write landed.
	next map[string][]string
}

// active returns the pods a new child starts with: held and not released.
func (m *crashModel) active() []string {
	var uids []string
	for uid := range m.held {
		if !m.released.Has(uid) {
			uids = append(uids, uid)
		}
	}
	slices.Sort(uids)
	return uids
}

// afterWrite returns what an admission's write holds: the garbage collection
// it starts with drops the released pods.
func (m *crashModel) afterWrite() map[string][]string {
	next := make(map[string][]string, len(m.held))
	for uid, devs := range m.held {
		if !m.released.Has(uid) {
			next[uid] = devs
		}
	}
	return next
}

// replay applies a child's lines to the model and returns the admission in
// flight at the kill, if any.
func (m *crashModel) replay(t *testing.T, k int, lines []string, st *crashStats) *inflight {
	t.Helper()
	var fl *inflight
	acked := false
	// The child started with the pods held and not released: its Start
	// released the others.
	m.startGC = m.afterWrite()
	for _, line := range lines {
		f := strings.Fields(line)
		switch {
		case len(f) == 1 && f[0] == crashReady:
		case len(f) == 2 && f[0] == crashRelease:
			if _, ok := m.held[f[1]]; !ok || m.released.Has(f[1]) {
				t.Errorf("kill %d: the child released %s, which it did not hold", k, f[1])
			}
			m.released.Insert(f[1])
			st.released++
		case len(f) == 3 && f[0] == crashBegin:
			count, err := strconv.Atoi(f[2])
			require.NoError(t, err, "kill %d: %q", k, line)
			fl = &inflight{uid: f[1], count: count, first: !acked, next: m.afterWrite()}
		case len(f) == 3 && f[0] == crashAck:
			require.NotNil(t, fl, "kill %d: %q without BEGIN", k, line)
			require.Equal(t, fl.uid, f[1], "kill %d: acknowledged another pod than begun", k)
			devs := strings.Split(f[2], ",")
			if len(devs) != fl.count {
				t.Errorf("kill %d: %s acknowledged with %d devices, asked %d", k, fl.uid, len(devs), fl.count)
			}
			m.held = fl.next
			m.released = sets.New[string]()
			m.startGC = nil
			if d := doubledDevices(m.held, f[1], devs); d > 0 {
				t.Errorf("kill %d: the manager gave %s devices %v, %d of them held by another pod", k, f[1], devs, d)
				st.doubled += d
			}
			m.held[f[1]] = devs
			fl = nil
			acked = true
			st.acked++
		default:
			require.Failf(t, "unexpected line from the crash-admitter", "kill %d: %q", k, line)
		}
	}
	return fl
}

// verify checks the checkpoint after a kill against the model, counts what
// is lost or doubled, and brings the model to what the file holds.
func (m *crashModel) verify(t *testing.T, k int, dir string, fl *inflight, st *crashStats) map[string][]string {
	t.Helper()
	file, err := readAllocations(dir)
	if err != nil {
		t.Errorf("kill %d: %v", k, err)
		st.undecoded++
		return m.held
	}
	for uid := range m.released {
		if _, ok := file[uid]; ok {
			st.releasedInFile++
		}
	}
	if d := doubledAmong(file); d > 0 {
		t.Errorf("kill %d: %d devices held by two pods in the checkpoint: %v", k, d, file)
		st.doubled += d
	}
	switch {
	case equalAllocations(file, m.held):
		st.asAcked++
		if fl != nil {
			st.inflightGone++
		}
		return file
	case fl != nil && inflightLanded(file, fl):
		st.inflightKept++
		m.held = file
		m.released = sets.New[string]()
		return file
	case fl != nil && fl.first && equalAllocations(file, fl.next):
		st.inflightGone++
		st.gcByDeviceUpdate++
		m.held = file
		m.released = sets.New[string]()
		return file
	case m.startGC != nil && equalAllocations(file, m.startGC):
		if fl != nil {
			st.inflightGone++
		}
		st.startGCByDeviceUpdate++
		m.held = file
		m.released = releasedIn(m.released, file)
		return file
	}
	// Neither state: say what differs, count it, and go on from the file.
	t.Errorf("kill %d: the checkpoint holds %v; acknowledged: %v (released since: %v), in flight: %+v",
		k, file, m.held, sets.List(m.released), fl)
	st.otherState++
	want := m.afterWrite()
	for uid, devs := range want {
		if got, ok := file[uid]; !ok || !slices.Equal(got, devs) {
			t.Errorf("kill %d: acknowledged pod %s lost: the checkpoint holds %v, want %v", k, uid, got, devs)
			st.lost++
		}
	}
	for uid, devs := range file {
		if _, ok := m.held[uid]; !ok && (fl == nil || uid != fl.uid) {
			t.Errorf("kill %d: the checkpoint holds %s (%v), which was never acknowledged nor in flight", k, uid, devs)
			st.unexpected++
		}
	}
	m.held = file
	m.released = releasedIn(m.released, file)
	return file
}

// releasedIn returns the released pods that file still holds.
func releasedIn(released sets.Set[string], file map[string][]string) sets.Set[string] {
	out := sets.New[string]()
	for uid := range released {
		if _, ok := file[uid]; ok {
			out.Insert(uid)
		}
	}
	return out
}

// inflightLanded reports whether file is the state the in-flight admission
// writes: the garbage-collected model plus the pod with its devices.
func inflightLanded(file map[string][]string, fl *inflight) bool {
	devs, ok := file[fl.uid]
	if !ok || len(devs) != fl.count || len(file) != len(fl.next)+1 {
		return false
	}
	for uid, want := range fl.next {
		if got, ok := file[uid]; !ok || !slices.Equal(got, want) {
			return false
		}
	}
	return true
}

// verifyRestart starts a manager on dir and ckpt, as a restarted node does,
// and checks that it holds exactly what the checkpoint holds.
func verifyRestart(t *testing.T, k int, dir, ckpt string, file map[string][]string, fl *inflight, st *crashStats) {
	t.Helper()
	m, err := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir, CheckpointDir: ckpt, Logger: quietLogger()})
	require.NoError(t, err)
	defer m.Stop()
	require.NoError(t, m.Start(nil, nil, nil, nil), "kill %d: restart", k)
	for uid, want := range file {
		if got := heldDevices(m, uid); !slices.Equal(got, want) {
			t.Errorf("kill %d: restarted manager gives %s devices %v, the checkpoint %v", k, uid, got, want)
			st.lost++
		}
	}
	if fl != nil {
		if _, ok := file[fl.uid]; !ok && heldDevices(m, fl.uid) != nil {
			t.Errorf("kill %d: restarted manager holds %s, which is not in the checkpoint", k, fl.uid)
			st.unexpected++
		}
	}
	st.restarts++
}

// readAllocations decodes and verifies the checkpoint in dir and returns the
// devices of nodeResource per pod (none when there is no file yet).
func readAllocations(dir string) (map[string][]string, error) {
	blob, err := os.ReadFile(filepath.Join(dir, checkpoint.DeviceManagerKey))
	if errors.Is(err, os.ErrNotExist) {
		return map[string][]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	data := checkpoint.New(nil, nil)
	if err := data.UnmarshalCheckpoint(blob); err != nil {
		return nil, fmt.Errorf("checkpoint does not decode: %w\n%s", err, blob)
	}
	if err := data.VerifyChecksum(); err != nil {
		return nil, fmt.Errorf("checkpoint does not verify: %w\n%s", err, blob)
	}
	entries, _ := data.GetData()
	out := map[string][]string{}
	for _, e := range entries {
		if e.ContainerName != nodeContainer || e.ResourceName != nodeResource {
			return nil, fmt.Errorf("unexpected entry %+v", e)
		}
		out[e.PodUID] = sortedDevices(append(out[e.PodUID], devicesOf(e.DeviceIDs)...))
	}
	return out, nil
}

func equalAllocations(a, b map[string][]string) bool {
	return len(a) == len(b) && func() bool {
		for uid, devs := range a {
			if other, ok := b[uid]; !ok || !slices.Equal(devs, other) {
				return false
			}
		}
		return true
	}()
}

// doubledDevices counts the devices of devs that a pod of held other than uid holds.
func doubledDevices(held map[string][]string, uid string, devs []string) int {
	n := 0
	for other, theirs := range held {
		if other == uid {
			continue
		}
		for _, d := range devs {
			if slices.Contains(theirs, d) {
				n++
			}
		}
	}
	return n
}

// doubledAmong counts the devices held by more than one pod.
func doubledAmong(file map[string][]string) int {
	owners := map[string]int{}
	for _, devs := range file {
		for _, d := range devs {
			owners[d]++
		}
	}
	n := 0
	for _, c := range owners {
		if c > 1 {
			n++
		}
	}
	return n
}

// tempFiles counts the temporary files in dir: names starting with ".",
// but for the files named in keep. A kill between a file's creation and its
// rename leaves one.
func tempFiles(t *testing.T, dir string, keep ...string) int {
	t.Helper()
	return len(tempNames(t, dir, keep...))
}

// tempNames returns the names tempFiles counts.
func tempNames(t *testing.T, dir string, keep ...string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") && !slices.Contains(keep, e.Name()) {
			names = append(names, e.Name())
		}
	}
	return names
}

// --- A node: a manager and a plugin in one directory. ---

const (
	nodeResource  = "example.com/dev"
	nodeContainer = "c"
	// nodeWait bounds every wait for a node to see its plugin's devices.
	nodeWait = 20 * time.Second
)

// nodePod returns a pod whose one container asks for count devices of
// nodeResource.
func nodePod(uid string, count int) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: "pod-" + uid, Namespace: "default"},
		Spec: v1.PodSpec{Containers: []v1.Container{{
			Name: nodeContainer,
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
				nodeResource: *resource.NewQuantity(int64(count), resource.DecimalSI),
			}},
		}}},
	}
}

// dmNode is a started manager with a registered plugin.
type dmNode struct {
	m      *devicemanager.ManagerImpl
	plugin *plugintest.Plugin
	pods   *activePods
}

// startDMNode starts a manager with opts (logs discarded unless opts has a
// logger; children log to their stderr, which the parent shows when they
// fail) and a plugin serving ndev healthy devices of nodeResource in
// opts.SocketDir, and waits until the manager sees them all.
func startDMNode(opts devicemanager.Options, pods *activePods, ndev int) (*dmNode, error) {
	if opts.Logger.GetSink() == nil {
		opts.Logger = quietLogger()
	}
	m, err := devicemanager.NewManagerImpl(opts)
	if err != nil {
		return nil, err
	}
	if err := m.Start(pods.list, nil, nil, nil); err != nil {
		m.Stop()
		return nil, fmt.Errorf("start manager: %w", err)
	}
	devs := make([]*pluginapi.Device, ndev)
	for i := range devs {
		devs[i] = &pluginapi.Device{ID: fmt.Sprintf("dev-%02d", i), Health: pluginapi.Healthy}
	}
	p, err := plugintest.New(plugintest.Options{
		ResourceName: nodeResource, SocketDir: opts.SocketDir, Devices: devs, Logger: quietLogger(),
	})
	if err != nil {
		m.Stop()
		return nil, err
	}
	n := &dmNode{m: m, plugin: p, pods: pods}
	if err := p.Start(); err != nil {
		n.stop()
		return nil, fmt.Errorf("start plugin: %w", err)
	}
	if err := p.Register(filepath.Join(opts.SocketDir, devicemanager.KubeletSocketName)); err != nil {
		n.stop()
		return nil, err
	}
	if err := pollUntil(nodeWait, func() bool {
		_, allocatable, _ := m.GetCapacity()
		q, ok := allocatable[nodeResource]
		return ok && q.Value() == int64(ndev)
	}); err != nil {
		n.stop()
		return nil, fmt.Errorf("the manager does not see the plugin's %d devices: %w", ndev, err)
	}
	return n, nil
}

func (n *dmNode) stop() {
	n.plugin.Stop()
	n.m.Stop()
}

// admit makes pod active and allocates its container, returning the devices
// it holds; a pod whose admission fails is made inactive again.
func (n *dmNode) admit(pod *v1.Pod) ([]string, error) {
	n.pods.add(pod)
	if err := n.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]); err != nil {
		n.pods.remove(pod.UID)
		return nil, err
	}
	return heldDevices(n.m, string(pod.UID)), nil
}

// heldDevices returns the devices of nodeResource the pod's container holds,
// sorted; nil when none.
func heldDevices(m *devicemanager.ManagerImpl, uid string) []string {
	devs := m.GetDevices(uid, nodeContainer)[nodeResource]
	if len(devs) == 0 {
		return nil
	}
	return sets.List(sets.KeySet(devs))
}

// quietLogger discards every log line. (logr.Discard would not: the manager
// and the plugin take its nil sink for "no logger given" and use klog.)
func quietLogger() logr.Logger {
	return funcr.New(func(string, string) {}, funcr.Options{})
}

// pollUntil checks cond every millisecond until it holds, or fails after
// timeout. A condition without a channel to wait on is polled, with a deadline.
func pollUntil(timeout time.Duration, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			return fmt.Errorf("condition not met within %v", timeout)
		case <-tick.C:
		}
	}
	return nil
}

// envSeed, when set, fixes the seed of the suite's random choices.
const envSeed = "DEVMGR_RELIABILITY_SEED"

// suiteSeed returns the seed of this test's random choices and logs how to
// repeat them.
func suiteSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(envSeed); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, envSeed)
	}
	t.Logf("seed %d (%s=%d repeats this run's random choices)", seed, envSeed, seed)
	return seed
}

// --- Child roles. ---

// Child roles that check things report like a test: roleT gives them
// testify's assert and require. Each failure is a FAIL line, the outcome one
// RESULT line of JSON; the parent turns FAIL lines into test errors.
const (
	roleFail   = "FAIL"
	roleResult = "RESULT"
)

type roleT struct{ failed bool }

func (r *roleT) Errorf(format string, args ...any) {
	r.failed = true
	fmt.Println(roleFail, strconv.Quote(fmt.Sprintf(format, args...)))
}

// FailNow ends the role's body (see runRole).
func (r *roleT) FailNow() { panic(roleFailNow{}) }

type roleFailNow struct{}

// runRole runs body as the whole of a child role and returns its exit code:
// 0, or 1 when an assertion failed. What body returns is printed as RESULT.
func runRole(body func(t *roleT) any) (code int) {
	t := &roleT{}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(roleFailNow); !ok {
				panic(r)
			}
			code = 1
		}
	}()
	b, err := json.Marshal(body(t))
	if err != nil {
		t.Errorf("encode result: %v", err)
		return 1
	}
	fmt.Println(roleResult, string(b))
	if t.failed {
		return 1
	}
	return 0
}

// runRoleChild runs the child role to its end (under wrap, if given),
// reports its FAIL lines and its exit as errors of t, and decodes its RESULT
// into result. It returns false if there was no RESULT.
func runRoleChild(t *testing.T, role string, env []string, result any, wrap ...string) bool {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	argv := append(slices.Clone(wrap), exe)
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), childEnv+"="+role), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with its parent
	runErr := cmd.Run()
	got := false
	for _, line := range strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n") {
		kind, rest, _ := strings.Cut(line, " ")
		switch kind {
		case roleFail:
			msg, err := strconv.Unquote(rest)
			if err != nil {
				msg = rest
			}
			t.Errorf("in child %s: %s", role, msg)
		case roleResult:
			require.NoError(t, json.Unmarshal([]byte(rest), result), "RESULT of %s", role)
			got = true
		case "":
		default:
			t.Logf("child %s: %s", role, line)
		}
	}
	if runErr != nil {
		t.Errorf("child %s: %v\n%s", role, runErr, stderr.String())
	}
	return got
}
