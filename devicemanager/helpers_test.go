package devicemanager

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podstate"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait for the manager to observe something.
const waitTimeout = 10 * time.Second

// harness runs a manager on a short temp dir with a fake clock and a mutable
// list of active pods.
type harness struct {
	t     testing.TB
	dir   string
	clock *testingclock.FakeClock
	pods  *podList
	ready *readyFlag
	opts  Options
	m     *ManagerImpl
}

type podList struct {
	mu   sync.Mutex
	pods []*v1.Pod
	// next, when set, is called by the next get (once) with the list it
	// returns, before returning it.
	next func([]*v1.Pod)
}

// onNextGet makes the next get call f with its list before returning it.
func (l *podList) onNextGet(f func([]*v1.Pod)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.next = f
}

func (l *podList) add(p ...*v1.Pod) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pods = append(l.pods, p...)
}

func (l *podList) remove(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, p := range l.pods {
		if p.UID == uid {
			l.pods = append(l.pods[:i:i], l.pods[i+1:]...)
			return
		}
	}
}

func (l *podList) get() []*v1.Pod {
	l.mu.Lock()
	out, next := append([]*v1.Pod(nil), l.pods...), l.next
	l.next = nil
	l.mu.Unlock()
	if next != nil {
		next(out)
	}
	return out
}

type readyFlag struct {
	mu    sync.Mutex
	ready bool
}

func (r *readyFlag) AllReady() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ready
}

func (r *readyFlag) set(v bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ready = v
}

// newHarness makes a manager (not started) in a fresh short directory.
func newHarness(t testing.TB, tune ...func(*Options)) *harness {
	t.Helper()
	dir, err := os.MkdirTemp("", "dm")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &harness{
		t: t, dir: dir,
		clock: testingclock.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)),
		pods:  &podList{},
		ready: &readyFlag{ready: true},
	}
	h.opts = Options{
		SocketDir: dir, Clock: h.clock, CallTimeout: 5 * time.Second, DialTimeout: 5 * time.Second,
		// Logs go to the test's log, shown when it fails (or with -v).
		Logger: ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(4))),
	}
	for _, f := range tune {
		f(&h.opts)
	}
	h.m = h.newManager()
	return h
}

func (h *harness) newManager() *ManagerImpl {
	m, err := NewManagerImpl(h.opts)
	require.NoError(h.t, err)
	h.t.Cleanup(func() { require.NoError(h.t, m.Stop()) })
	return m
}

func (h *harness) start() *harness {
	h.t.Helper()
	require.NoError(h.t, h.m.Start(h.pods.get, h.ready, nil, nil))
	return h
}

// restart stops the manager and starts a new one on the same directories,
// with the given running containers (nil: none).
func (h *harness) restart(containers podstate.ContainerMap, running sets.Set[string]) {
	h.t.Helper()
	require.NoError(h.t, h.m.Stop())
	h.m = h.newManager()
	require.NoError(h.t, h.m.Start(h.pods.get, h.ready, containers, running))
}

func (h *harness) kubeletSocket() string { return filepath.Join(h.dir, KubeletSocketName) }

// plugin starts a fake plugin for resource in the harness directory (not
// registered yet).
func (h *harness) plugin(res string, devs []*pluginapi.Device, tune ...func(*plugintest.Options)) *plugintest.Plugin {
	h.t.Helper()
	// The tests decide when a plugin is back after a restart.
	o := plugintest.Options{ResourceName: res, SocketDir: h.dir, Devices: devs, NoReregister: true}
	for _, f := range tune {
		f(&o)
	}
	p, err := plugintest.New(o)
	require.NoError(h.t, err)
	h.t.Cleanup(p.Stop)
	require.NoError(h.t, p.Start())
	return p
}

// register registers p and waits until the manager sees its whole device list.
func (h *harness) register(p *plugintest.Plugin) *plugintest.Plugin {
	h.t.Helper()
	require.NoError(h.t, p.Register(h.kubeletSocket()))
	h.waitCapacity(p.ResourceName(), int64(len(p.Devices())), int64(countHealthy(p.Devices())))
	return p
}

// reregister registers p again on the socket of its connected instance and
// waits until the instance that replaces it has received its first device
// list. The capacity cannot show that when the list is the one the replaced
// instance sent; p's list must name a device.
func (h *harness) reregister(p *plugintest.Plugin) {
	h.t.Helper()
	before := h.listsReceived(p.ResourceName())
	require.NoError(h.t, p.Register(h.kubeletSocket()))
	h.eventually(func() bool { return h.listsReceived(p.ResourceName()) > before },
		"the new instance of %s received its device list", p.SocketPath())
}

// listsReceived is the number of ListAndWatch messages of res the manager
// has applied from plugin streams, from its message size histogram; and
// their total size.
func (h *harness) listsReceived(res string) uint64 {
	h.t.Helper()
	count, _ := h.listSizes(res)
	return count
}

func (h *harness) listSizes(res string) (count uint64, bytes float64) {
	h.t.Helper()
	var m dto.Metric
	require.NoError(h.t, h.m.metrics.messageBytes.WithLabelValues(res).(prometheus.Metric).Write(&m))
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// registered starts and registers a plugin.
func (h *harness) registered(res string, devs []*pluginapi.Device, tune ...func(*plugintest.Options)) *plugintest.Plugin {
	h.t.Helper()
	return h.register(h.plugin(res, devs, tune...))
}

// waitCapacity waits until GetCapacity reports capacity and allocatable for res.
func (h *harness) waitCapacity(res string, capacity, allocatable int64) {
	h.t.Helper()
	h.eventually(func() bool {
		c, a := h.capacity(res)
		return c == capacity && a == allocatable
	}, "capacity of %s = %d/%d", res, capacity, allocatable)
}

// capacity returns the capacity and allocatable of res (-1 when absent).
func (h *harness) capacity(res string) (int64, int64) {
	c, a, _ := h.m.GetCapacity()
	cq, ok := c[v1.ResourceName(res)]
	if !ok {
		return -1, -1
	}
	aq := a[v1.ResourceName(res)]
	return cq.Value(), aq.Value()
}

// waitCtx returns a context that ends after waitTimeout, or with the test.
func (h *harness) waitCtx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	h.t.Cleanup(cancel)
	return ctx
}

func (h *harness) eventually(cond func() bool, msg string, args ...any) {
	h.t.Helper()
	require.Eventuallyf(h.t, cond, waitTimeout, 5*time.Millisecond, msg, args...)
}

func countHealthy(devs []*pluginapi.Device) int {
	n := 0
	for _, d := range devs {
		if d.Health == pluginapi.Healthy {
			n++
		}
	}
	return n
}

// devices returns healthy devices named prefix0..prefixN-1 without topology.
func devices(prefix string, n int) []*pluginapi.Device {
	out := make([]*pluginapi.Device, n)
	for i := range out {
		out[i] = &pluginapi.Device{ID: fmt.Sprintf("%s%d", prefix, i), Health: pluginapi.Healthy}
	}
	return out
}

func dev(id, health string, numa ...int64) *pluginapi.Device {
	d := &pluginapi.Device{ID: id, Health: health}
	if len(numa) > 0 {
		d.Topology = &pluginapi.TopologyInfo{}
		for _, n := range numa {
			d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: n})
		}
	}
	return d
}

// ctr builds a container asking for the given resources (name, count pairs).
func ctr(name string, limits ...any) v1.Container {
	c := v1.Container{Name: name, Resources: v1.ResourceRequirements{Limits: v1.ResourceList{}}}
	for i := 0; i < len(limits); i += 2 {
		c.Resources.Limits[v1.ResourceName(limits[i].(string))] = *resource.NewQuantity(int64(limits[i+1].(int)), resource.DecimalSI)
	}
	return c
}

func newPod(uid string, containers ...v1.Container) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: "pod-" + uid, Namespace: "default"},
		Spec:       v1.PodSpec{Containers: containers},
	}
}

// admit allocates every init container then every container of pod, in order.
func (h *harness) admit(pod *v1.Pod) error {
	h.t.Helper()
	for i := range pod.Spec.InitContainers {
		if err := h.m.Allocate(context.Background(), pod, &pod.Spec.InitContainers[i]); err != nil {
			return err
		}
	}
	for i := range pod.Spec.Containers {
		if err := h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[i]); err != nil {
			return err
		}
	}
	return nil
}

// held returns the devices of res the container holds, sorted.
func (h *harness) held(pod *v1.Pod, container, res string) []string {
	return sets.List(sets.KeySet(h.m.GetDevices(string(pod.UID), container)[res]))
}

// deviceMap returns r's devices by ID, in a map of their own.
func (r *resourceState) deviceMap() map[string]*pluginapi.Device {
	return maps.Collect(r.byID)
}

// faultyStore wraps the real store: CreateCheckpoint fails (after writing when
// writeThenFail) while failWrites is set; ListCheckpoints fails with listErr.
type faultyStore struct {
	checkpoint.Manager
	mu                        sync.Mutex
	failWrites, writeThenFail bool
	listErr                   error
}

func (s *faultyStore) CreateCheckpoint(key string, cp checkpoint.Checkpoint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.failWrites {
		return s.Manager.CreateCheckpoint(key, cp)
	}
	if s.writeThenFail {
		_ = s.Manager.CreateCheckpoint(key, cp)
	}
	return errors.New("injected write failure")
}
func (s *faultyStore) ListCheckpoints() ([]string, error) {
	if s.listErr != nil {
		return nil, s.listErr
	}
	return s.Manager.ListCheckpoints()
}
func (s *faultyStore) set(fail, writeThenFail bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failWrites, s.writeThenFail = fail, writeThenFail
}
func (h *harness) faultyStore() *faultyStore {
	h.m.writer.mu.Lock() // no write in progress
	defer h.m.writer.mu.Unlock()
	s := &faultyStore{Manager: h.m.writer.store}
	h.m.writer.store = s
	return s
}
