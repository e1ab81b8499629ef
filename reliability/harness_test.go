//go:build reliability

package reliability

// Shared helpers of the suite: a manager on a short temp directory driven
// the way a kubelet drives it (rig), fake plugins in process (plugintest)
// and in a child process (pluginChild), leak accounting (leakCheck) and the
// allocation audit (rig.audit). Any test file of the package may use them.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/internal/fdcheck"
	"github.com/openkubelet/devmgr/plugintest"
)

// waitLimit bounds every wait of the suite for something to happen: a
// condition, a line from a child, a call in flight.
const waitLimit = 20 * time.Second

// pollEvery is how often a condition is checked while waiting for it.
const pollEvery = 2 * time.Millisecond

// Resource names used across the suite.
const (
	resGPU       = "example.com/gpu"
	resNIC       = "example.com/nic"
	resBystander = "example.com/bystander"
)

// shortDir returns a new directory under the system temp dir with a short
// name (a unix socket path must fit in 108 bytes), removed at cleanup.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rl")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// memDir returns a new directory on tmpfs (/dev/shm) when the machine has
// one, else shortDir. Tests that measure admission logic rather than the
// disk keep the checkpoint there, so that 10,000 admissions do not cost
// 20,000 fsyncs; crash consistency is not their subject.
func memDir(t testing.TB) string {
	t.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if dir, err := os.MkdirTemp("/dev/shm", "rl"); err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return shortDir(t)
}

// recordOnExit records *fig when the test ends, however it ends (defer it
// first thing): a test stopped by a failure still reports what it did, with
// "test failed" set in its details.
func recordOnExit(t *testing.T, fig *Figures, start time.Time) {
	if fig.Details == nil {
		fig.Details = map[string]any{}
	}
	if t.Failed() {
		fig.Details["test failed"] = true
	}
	if fig.Elapsed == "" {
		fig.Elapsed = time.Since(start).Round(time.Millisecond).String()
	}
	record(t, *fig)
}

// waitFor waits until cond holds, polling, and fails the test with what when
// waitLimit passes first.
func waitFor(t testing.TB, cond func() bool, what string, args ...any) {
	t.Helper()
	require.Eventuallyf(t, cond, waitLimit, pollEvery, what, args...)
}

// activePods is the pod list behind the manager's ActivePodsFunc.
type activePods struct {
	mu   sync.Mutex
	pods map[types.UID]*v1.Pod
	// onList, when set, runs after list took its snapshot, before it
	// returns it: a test can hold a caller there.
	onList func()
}

// setOnList sets (nil: clears) the hook run by list after its snapshot.
func (a *activePods) setOnList(f func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.onList = f
}

func newActivePods() *activePods { return &activePods{pods: map[types.UID]*v1.Pod{}} }

func (a *activePods) add(p *v1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pods[p.UID] = p
}

func (a *activePods) remove(uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.pods, uid)
}

func (a *activePods) list() []*v1.Pod {
	a.mu.Lock()
	out := make([]*v1.Pod, 0, len(a.pods))
	for _, p := range a.pods {
		out = append(out, p)
	}
	hook := a.onList
	a.mu.Unlock()
	if hook != nil {
		hook()
	}
	return out
}

// uids returns the UIDs of the active pods, sorted.
func (a *activePods) uids() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.pods))
	for uid := range a.pods {
		out = append(out, string(uid))
	}
	slices.Sort(out)
	return out
}

// podOf returns a pod with one container "c" whose limits are the given
// (resource name, count) pairs.
func podOf(uid string, limits ...any) *v1.Pod {
	c := v1.Container{Name: "c", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{}}}
	for i := 0; i+1 < len(limits); i += 2 {
		n := limits[i+1].(int)
		c.Resources.Limits[v1.ResourceName(limits[i].(string))] = *resource.NewQuantity(int64(n), resource.DecimalSI)
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: "pod-" + uid, Namespace: "reliability"},
		Spec:       v1.PodSpec{Containers: []v1.Container{c}},
	}
}

// healthyDevices returns n healthy devices prefix0..prefix<n-1>, no topology.
func healthyDevices(prefix string, n int) []*pluginapi.Device {
	out := make([]*pluginapi.Device, n)
	for i := range out {
		out[i] = &pluginapi.Device{ID: prefix + strconv.Itoa(i), Health: pluginapi.Healthy}
	}
	return out
}

// device returns a device with the given health and NUMA node ids.
func device(id, health string, numa ...int64) *pluginapi.Device {
	d := &pluginapi.Device{ID: id, Health: health}
	if len(numa) > 0 {
		d.Topology = &pluginapi.TopologyInfo{}
		for _, n := range numa {
			d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: n})
		}
	}
	return d
}

// ids returns the IDs of devs, sorted.
func ids(devs devicemanager.DeviceInstances) []string {
	return sets.List(sets.KeySet(devs))
}

// grant is what a successful admission gave one pod: container -> resource
// -> device IDs (sorted).
type grant map[string]map[string][]string

// rig is one manager on a short temp directory with a mutable list of active
// pods, the way a kubelet drives it, plus the record of every allocation it
// granted (for the audit) and the plugins and children to stop.
type rig struct {
	t    testing.TB
	dir  string
	opts devicemanager.Options
	m    *devicemanager.ManagerImpl
	pods *activePods
	logs ktesting.Buffer
	// by is the well-behaved bystander plugin, when bystander was called.
	by *bystander

	// mu guards the fields below.
	mu       sync.Mutex
	granted  map[types.UID]grant
	plugins  []*plugintest.Plugin
	children []*pluginChild
}

// newRig makes a manager (not started) in a fresh short directory. Its logs
// at verbosity 1 (errors and V(1)) go to a buffer that errorLogs reads, and
// to the test's log only if the test fails: plugins dying is what this suite
// does, and each death is an error log. tune adjusts the options.
func newRig(t testing.TB, tune ...func(*devicemanager.Options)) *rig {
	t.Helper()
	logger := ktesting.NewLogger(ktesting.NopTL{}, ktesting.NewConfig(ktesting.Verbosity(1), ktesting.BufferLogs(true)))
	under, ok := logger.GetSink().(ktesting.Underlier)
	require.True(t, ok)
	r := &rig{t: t, dir: shortDir(t), pods: newActivePods(), logs: under.GetBuffer(), granted: map[types.UID]grant{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("manager logs:\n%s", r.logs.String())
		}
	})
	r.opts = devicemanager.Options{SocketDir: r.dir, Logger: logger}
	for _, f := range tune {
		f(&r.opts)
	}
	r.m = r.newManager()
	return r
}

func (r *rig) newManager() *devicemanager.ManagerImpl {
	m, err := devicemanager.NewManagerImpl(r.opts)
	require.NoError(r.t, err)
	r.t.Cleanup(func() { _ = m.Stop() })
	return m
}

// start starts the manager with the rig's pod list, sources always ready.
func (r *rig) start() *rig {
	r.t.Helper()
	require.NoError(r.t, r.m.Start(r.pods.list, nil, nil, nil))
	return r
}

// restart stops the manager and starts a new one on the same directories, as
// a kubelet restart does (the new one removes the plugins' sockets). A
// bystander is started and registered again.
func (r *rig) restart() {
	r.t.Helper()
	require.NoError(r.t, r.m.Stop())
	r.m = r.newManager()
	r.start()
	if r.by != nil {
		r.by.p.Stop()
		r.bystander()
	}
}

// shutdown stops every plugin and child the rig started, then the manager.
func (r *rig) shutdown() {
	r.t.Helper()
	r.mu.Lock()
	plugins, children := r.plugins, r.children
	r.plugins, r.children = nil, nil
	r.mu.Unlock()
	for _, c := range children {
		c.kill()
	}
	for _, p := range plugins {
		p.Stop()
	}
	require.NoError(r.t, r.m.Stop())
}

func (r *rig) kubeletSocket() string {
	return filepath.Join(r.dir, devicemanager.KubeletSocketName)
}

// plugin starts a fake plugin for res on endpoint in the rig's directory,
// not registered yet. It logs errors only, to the test's log.
func (r *rig) plugin(res, endpoint string, devs []*pluginapi.Device, tune ...func(*plugintest.Options)) *plugintest.Plugin {
	r.t.Helper()
	o := plugintest.Options{
		ResourceName: res, SocketDir: r.dir, Endpoint: endpoint, Devices: devs,
		Logger: ktesting.NewLogger(r.t, ktesting.NewConfig(ktesting.Verbosity(0))),
		// The suite decides when a plugin is back after a restart.
		NoReregister: true,
	}
	for _, f := range tune {
		f(&o)
	}
	p, err := plugintest.New(o)
	require.NoError(r.t, err)
	r.t.Cleanup(p.Stop)
	require.NoError(r.t, p.Start())
	r.mu.Lock()
	r.plugins = append(r.plugins, p)
	r.mu.Unlock()
	return p
}

// register registers p and waits until the manager reports its whole device
// list (capacity and allocatable as p lists them).
func (r *rig) register(p *plugintest.Plugin) *plugintest.Plugin {
	r.t.Helper()
	require.NoError(r.t, p.Register(r.kubeletSocket()))
	devs := p.Devices()
	healthy := 0
	for _, d := range devs {
		if d.Health == pluginapi.Healthy {
			healthy++
		}
	}
	distinct := sets.New[string]()
	for _, d := range devs {
		distinct.Insert(d.ID)
	}
	r.waitCapacity(p.ResourceName(), int64(distinct.Len()), int64(healthy))
	return p
}

// registerWith sends req on behalf of p within waitLimit and returns the
// gRPC status error the manager answered (nil on success).
func (r *rig) registerWith(p *plugintest.Plugin, req *pluginapi.RegisterRequest) error {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	err := p.RegisterWith(ctx, r.kubeletSocket(), req)
	if err == nil {
		return nil
	}
	if inner := errors.Unwrap(err); inner != nil {
		return inner
	}
	return err
}

// capacity returns the capacity and allocatable of res; -1, -1 when the
// manager does not report res.
func (r *rig) capacity(res string) (int64, int64) {
	c, a, _ := r.m.GetCapacity()
	cq, ok := c[v1.ResourceName(res)]
	if !ok {
		return -1, -1
	}
	aq := a[v1.ResourceName(res)]
	return cq.Value(), aq.Value()
}

// waitCapacity waits until the manager reports res with exactly capacity
// devices, allocatable of them healthy.
func (r *rig) waitCapacity(res string, capacity, allocatable int64) {
	r.t.Helper()
	var c, a int64
	ok := assert.Eventually(r.t, func() bool {
		c, a = r.capacity(res)
		return c == capacity && a == allocatable
	}, waitLimit, pollEvery)
	if !ok {
		require.FailNowf(r.t, "capacity", "%s: want %d/%d, have %d/%d", res, capacity, allocatable, c, a)
	}
}

// admit allocates every container of pod, adding it to the active pods
// first, with a background context. On success the grant is remembered for
// the audit. Safe from any goroutine: it never fails the test itself.
func (r *rig) admit(pod *v1.Pod) error {
	return r.admitCtx(context.Background(), pod)
}

// admitCtx is admit with the caller's context.
func (r *rig) admitCtx(ctx context.Context, pod *v1.Pod) error {
	r.pods.add(pod)
	for i := range pod.Spec.Containers {
		if err := r.m.Allocate(ctx, pod, &pod.Spec.Containers[i]); err != nil {
			return err
		}
	}
	g := grant{}
	for _, c := range pod.Spec.Containers {
		g[c.Name] = map[string][]string{}
		for res, devs := range r.m.GetDevices(string(pod.UID), c.Name) {
			g[c.Name][res] = ids(devs)
		}
	}
	r.mu.Lock()
	r.granted[pod.UID] = g
	r.mu.Unlock()
	return nil
}

// release ends pod as a kubelet does: it leaves the active pods and the
// manager garbage-collects. Its grant is forgotten.
func (r *rig) release(pod *v1.Pod) {
	r.pods.remove(pod.UID)
	r.m.UpdateAllocatedDevices()
	r.mu.Lock()
	delete(r.granted, pod.UID)
	r.mu.Unlock()
}

// held returns the devices of res the pod's container c holds, sorted.
func (r *rig) held(pod *v1.Pod, res string) []string {
	return ids(r.m.GetDevices(string(pod.UID), "c")[res])
}

// audit compares every grant with what the manager reports now: a grant
// whose devices changed or vanished is lost; a device two containers hold is
// doubled. Both are reported as test errors too.
func (r *rig) audit() (lost, doubled int) {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	holder := map[string]map[string]string{} // resource -> device -> pod/container
	for uid, g := range r.granted {
		for container, want := range g {
			have := r.m.GetDevices(string(uid), container)
			for res, wantIDs := range want {
				if got := ids(have[res]); !slices.Equal(got, wantIDs) {
					lost++
					r.t.Errorf("lost allocation: pod %s container %s resource %s had %v, now %v", uid, container, res, wantIDs, got)
				}
			}
			for res, devs := range have {
				if holder[res] == nil {
					holder[res] = map[string]string{}
				}
				for id := range devs {
					who := string(uid) + "/" + container
					if other, ok := holder[res][id]; ok {
						doubled++
						r.t.Errorf("device %s/%q held by %s and %s", res, id, other, who)
					}
					holder[res][id] = who
				}
			}
		}
	}
	return lost, doubled
}

// errorLogs returns the error entries the manager logged, as
// "message: err [key value ...]".
func (r *rig) errorLogs() []string {
	var out []string
	for _, e := range r.logs.Data() {
		if e.Type == ktesting.LogError {
			out = append(out, fmt.Sprintf("%s: %v %v", e.Message, e.Err, e.ParameterKVList))
		}
	}
	return out
}

// waitErrorLog waits until the manager logged an error whose "message: err"
// contains every one of parts, and returns it.
func (r *rig) waitErrorLog(parts ...string) string {
	r.t.Helper()
	var found string
	waitFor(r.t, func() bool {
		for _, l := range r.errorLogs() {
			if containsAll(l, parts...) {
				found = l
				return true
			}
		}
		return false
	}, "an error log containing %q", parts)
	return found
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// bystander is a well-behaved plugin registered next to a faulty one: the
// manager must keep serving it.
type bystander struct {
	r *rig
	p *plugintest.Plugin
	n int
}

// bystander starts and registers the well-behaved plugin (16 devices on
// by.sock) and makes it the rig's bystander.
func (r *rig) bystander() *bystander {
	r.t.Helper()
	b := &bystander{r: r, p: r.register(r.plugin(resBystander, "by.sock", healthyDevices("by", 16)))}
	r.by = b
	return b
}

// admit admits a new pod asking one bystander device, checks that it got
// exactly one through the bystander's Allocate, and releases it.
func (b *bystander) admit(t testing.TB) {
	t.Helper()
	b.n++
	pod := podOf(fmt.Sprintf("bystander-%d", b.n), resBystander, 1)
	calls := len(b.p.CallsOf(plugintest.MethodAllocate))
	require.NoError(t, b.r.admit(pod), "the manager still serves a well-behaved plugin")
	assert.Len(t, b.r.held(pod, resBystander), 1)
	assert.Len(t, b.p.CallsOf(plugintest.MethodAllocate), calls+1)
	b.r.release(pod)
}

// waitCalls waits until p has received at least n calls of method.
func waitCalls(t testing.TB, p *plugintest.Plugin, method plugintest.Method, n int) []plugintest.Call {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	calls, err := p.WaitForCalls(ctx, method, n)
	require.NoError(t, err)
	return calls
}

// waitResult waits for the result of an operation run in a goroutine.
func waitResult[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		require.FailNow(t, "timed out waiting for "+what)
		panic("unreachable")
	}
}

// leakCheck remembers the goroutines and the open file descriptors of the
// process at one moment, to check later that whatever started since has
// ended. The file descriptor check is "no more than before": something an
// earlier test started may end in between.
type leakCheck struct {
	fds        map[string]string
	goroutines goleak.Option
	count      int
}

func newLeakCheck(t testing.TB) *leakCheck {
	t.Helper()
	return &leakCheck{fds: fdcheck.Snapshot(t), goroutines: goleak.IgnoreCurrent(), count: runtime.NumGoroutine()}
}

// verify waits until the process holds no more file descriptors than at the
// snapshot and every goroutine started since has ended, or waitLimit passes;
// it reports leaks as test errors and returns their numbers.
func (l *leakCheck) verify(t testing.TB) (fds, goroutines int) {
	t.Helper()
	var now map[string]string
	deadline := time.Now().Add(waitLimit)
	for {
		now = fdcheck.Snapshot(t)
		if len(now) <= len(l.fds) {
			break
		}
		if time.Now().After(deadline) {
			fds = len(now) - len(l.fds)
			t.Errorf("file descriptors leaked: %d at the snapshot, %d now; new: %v", len(l.fds), len(now), fdcheck.New(l.fds, now))
			break
		}
		waitTick()
	}
	for {
		err := goleak.Find(l.goroutines) // retries for a while by itself
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			goroutines = max(1, runtime.NumGoroutine()-l.count)
			t.Errorf("goroutines leaked: %v", err)
			break
		}
	}
	return fds, goroutines
}

// metricCount returns, from the metric family name gathered from g, the
// series whose labels include every one of labels: a histogram's number of
// samples, or a counter's value; 0 when there is no such series.
func metricCount(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) int {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			matched := 0
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
					matched++
				}
			}
			if matched < len(labels) {
				continue
			}
			if h := m.GetHistogram(); h != nil {
				return int(h.GetSampleCount())
			}
			return int(m.GetCounter().GetValue())
		}
	}
	return 0
}

// waitTick waits one polling interval: the pace of a loop that waits for a
// condition with a deadline.
func waitTick() {
	t := time.NewTimer(pollEvery)
	defer t.Stop()
	<-t.C
}

// settledGoroutines waits until at most want goroutines run, or waitLimit
// passes, and returns the last count (goroutines of stopped servers and
// closed connections take a moment to return).
func settledGoroutines(want int) int {
	deadline := time.Now().Add(waitLimit)
	for {
		n := runtime.NumGoroutine()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		waitTick()
	}
}

// The plugin child: the test binary re-executed as a device plugin process,
// so that "the plugin process dies" is a real SIGKILL of a real process.

// rolePlugin is the child role that runs a plugintest plugin.
const rolePlugin = "reliability-plugin"

func init() { children[rolePlugin] = runPluginChild }

// Environment of the plugin child.
const (
	envChildDir       = "DEVMGR_RL_DIR"       // the manager's socket directory
	envChildResource  = "DEVMGR_RL_RESOURCE"  // resource name
	envChildEndpoint  = "DEVMGR_RL_ENDPOINT"  // socket file name
	envChildDevices   = "DEVMGR_RL_DEVICES"   // number of healthy devices d0..
	envChildHang      = "DEVMGR_RL_HANG"      // a plugintest.Method to hang in, announced on stdout
	envChildPreStart  = "DEVMGR_RL_PRESTART"  // "1": PreStartRequired
	envChildPreferred = "DEVMGR_RL_PREFERRED" // "1": GetPreferredAllocationAvailable
)

// Lines the plugin child writes on stdout, its only output there.
const (
	lineReady        = "ready"         // registered
	lineReregistered = "re-registered" // registered again on request, the new stream opened
	lineHangPrefix   = "hang "         // + method: a call arrived and hangs
)

// childConfig configures a plugin child.
type childConfig struct {
	resource, endpoint  string
	devices             int
	hang                plugintest.Method
	preStart, preferred bool
}

// runPluginChild is the plugin child's main: it serves a plugintest plugin,
// registers with the manager, writes lineReady, then on each "reregister"
// line of stdin registers again and writes lineReregistered once the new
// connection has opened its ListAndWatch stream (the capacity does not
// change: its list is the same); it stops when stdin ends (the parent closed
// it or died). A call of the method named by envChildHang writes
// lineHangPrefix+method and hangs until the caller gives up: the parent kills
// the process meanwhile.
func runPluginChild() int {
	var outMu sync.Mutex
	say := func(line string) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintln(os.Stdout, line)
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "plugin child:", err)
		return 1
	}
	dir := os.Getenv(envChildDir)
	n, err := strconv.Atoi(os.Getenv(envChildDevices))
	if err != nil {
		return fail(err)
	}
	p, err := plugintest.New(plugintest.Options{
		ResourceName:                    os.Getenv(envChildResource),
		SocketDir:                       dir,
		Endpoint:                        os.Getenv(envChildEndpoint),
		Devices:                         healthyDevices("d", n),
		PreStartRequired:                os.Getenv(envChildPreStart) == "1",
		GetPreferredAllocationAvailable: os.Getenv(envChildPreferred) == "1",
		// The default logger writes errors to stderr, which the parent
		// shows when the child fails.
	})
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hang := plugintest.Method(os.Getenv(envChildHang))
	announce := func(ctx context.Context) error {
		say(lineHangPrefix + string(hang))
		<-ctx.Done()
		return ctx.Err()
	}
	switch hang {
	case "":
	case plugintest.MethodAllocate:
		p.SetAllocateFunc(func(ctx context.Context, _ *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
			return nil, announce(ctx)
		})
	case plugintest.MethodPreStartContainer:
		p.SetPreStartFunc(func(ctx context.Context, _ *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
			return nil, announce(ctx)
		})
	case plugintest.MethodGetPreferredAllocation:
		p.SetPreferredAllocationFunc(func(ctx context.Context, _ *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
			return nil, announce(ctx)
		})
	case plugintest.MethodListAndWatch:
		p.Block(plugintest.MethodListAndWatch) // released by Stop
		go func() {
			if _, err := p.WaitForCalls(ctx, plugintest.MethodListAndWatch, 1); err == nil {
				say(lineHangPrefix + string(hang))
			}
		}()
	default:
		return fail(fmt.Errorf("cannot hang in %q", hang))
	}
	if err := p.Start(); err != nil {
		return fail(err)
	}
	defer p.Stop()
	kubelet := filepath.Join(dir, devicemanager.KubeletSocketName)
	if err := p.Register(kubelet); err != nil {
		return fail(err)
	}
	say(lineReady)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "reregister" {
			streams := len(p.CallsOf(plugintest.MethodListAndWatch))
			if err := p.Register(kubelet); err != nil {
				return fail(err)
			}
			if _, err := p.WaitForCalls(ctx, plugintest.MethodListAndWatch, streams+1); err != nil {
				return fail(err)
			}
			say(lineReregistered)
		}
	}
	return 0
}

// pluginChild is a running plugin child process.
type pluginChild struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *syncBuffer
	// readerDone is closed when stdout reached EOF (the process is gone).
	readerDone chan struct{}

	// mu guards the fields below.
	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced when a line arrives or stdout ends
	reaped  bool
}

// syncBuffer is a bytes buffer safe for a writer goroutine and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startChild starts a plugin child serving in the rig's directory. It is
// killed at cleanup if still running.
func (r *rig) startChild(cfg childConfig) *pluginChild {
	r.t.Helper()
	exe, err := os.Executable()
	require.NoError(r.t, err)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(),
		childEnv+"="+rolePlugin,
		envChildDir+"="+r.dir,
		envChildResource+"="+cfg.resource,
		envChildEndpoint+"="+cfg.endpoint,
		envChildDevices+"="+strconv.Itoa(cfg.devices),
		envChildHang+"="+string(cfg.hang),
		envChildPreStart+"="+boolEnv(cfg.preStart),
		envChildPreferred+"="+boolEnv(cfg.preferred),
	)
	c := &pluginChild{t: r.t, cmd: cmd, stderr: &syncBuffer{}, readerDone: make(chan struct{}), changed: make(chan struct{})}
	cmd.Stderr = c.stderr
	c.stdin, err = cmd.StdinPipe()
	require.NoError(r.t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(r.t, err)
	require.NoError(r.t, cmd.Start())
	go c.read(stdout)
	r.t.Cleanup(c.kill)
	r.mu.Lock()
	r.children = append(r.children, c)
	r.mu.Unlock()
	return c
}

func boolEnv(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// read collects stdout lines until EOF; it ends when the process is gone.
func (c *pluginChild) read(stdout io.Reader) {
	defer close(c.readerDone)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		c.mu.Lock()
		c.lines = append(c.lines, sc.Text())
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
	}
	c.mu.Lock()
	close(c.changed)
	c.changed = nil
	c.mu.Unlock()
}

// expect waits until the child has written line (at any time since it
// started), failing the test with the child's stderr if it does not in
// waitLimit or exits first.
func (c *pluginChild) expect(line string) {
	c.t.Helper()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	for {
		c.mu.Lock()
		found, changed := slices.Contains(c.lines, line), c.changed
		c.mu.Unlock()
		if found {
			return
		}
		if changed == nil {
			require.FailNowf(c.t, "plugin child", "exited before writing %q; stderr:\n%s", line, c.stderr.String())
		}
		select {
		case <-changed:
		case <-timer.C:
			require.FailNowf(c.t, "plugin child", "did not write %q in %v; stderr:\n%s", line, waitLimit, c.stderr.String())
		}
	}
}

// reregister asks the child to register again and waits until it has and
// the new connection has opened its ListAndWatch stream.
func (c *pluginChild) reregister() {
	c.t.Helper()
	c.mu.Lock()
	want := countOf(c.lines, lineReregistered) + 1
	c.mu.Unlock()
	_, err := io.WriteString(c.stdin, "reregister\n")
	require.NoError(c.t, err)
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	for {
		c.mu.Lock()
		n, changed := countOf(c.lines, lineReregistered), c.changed
		c.mu.Unlock()
		if n >= want {
			return
		}
		if changed == nil {
			require.FailNowf(c.t, "plugin child", "exited while re-registering; stderr:\n%s", c.stderr.String())
		}
		select {
		case <-changed:
		case <-timer.C:
			require.FailNowf(c.t, "plugin child", "did not re-register in %v; stderr:\n%s", waitLimit, c.stderr.String())
		}
	}
}

func countOf(lines []string, line string) int {
	n := 0
	for _, l := range lines {
		if l == line {
			n++
		}
	}
	return n
}

// claimReap reports whether the caller is the first to reap the child, and
// marks it reaped.
func (c *pluginChild) claimReap() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := !c.reaped
	c.reaped = true
	return first
}

// kill sends SIGKILL and reaps the process: a crash, no cleanup in the
// child (its socket file stays behind). Idempotent.
func (c *pluginChild) kill() {
	if !c.claimReap() {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.readerDone
	_ = c.stdin.Close()
	_ = c.cmd.Wait()
}

// killedBy reports whether the child ended by signal sig, as its process
// state says. Call it after kill or stop returned, from the same goroutine.
func (c *pluginChild) killedBy(sig syscall.Signal) bool {
	if c.cmd.ProcessState == nil {
		return false
	}
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// stop closes the child's stdin, so that it stops its plugin and exits, and
// reaps it; the exit must be clean.
func (c *pluginChild) stop() {
	c.t.Helper()
	if !c.claimReap() {
		return
	}
	_ = c.stdin.Close()
	done := make(chan error, 1)
	go func() {
		<-c.readerDone
		done <- c.cmd.Wait()
	}()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	select {
	case err := <-done:
		assert.NoError(c.t, err, "plugin child exit; stderr:\n%s", c.stderr.String())
	case <-timer.C:
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		err := <-done
		c.t.Errorf("plugin child did not exit in %v after its stdin closed (killed: %v); stderr:\n%s", waitLimit, err, c.stderr.String())
	}
}
