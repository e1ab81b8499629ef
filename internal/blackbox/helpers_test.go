package blackbox_test

import (
	"context"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/podstate"
)

const (
	waitFor = 15 * time.Second
	tick    = 2 * time.Millisecond

	resGPU = "vendor.com/gpu"
	resNIC = "vendor.com/nic"
)

// tempDir returns a short directory (socket paths must fit in 108 bytes)
// removed at cleanup.
func tempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bb")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// activePods is a mutable pod list behind an ActivePodsFunc.
type activePods struct {
	mu   sync.Mutex
	pods []*v1.Pod
}

func (a *activePods) get() []*v1.Pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*v1.Pod(nil), a.pods...)
}

func (a *activePods) set(pods ...*v1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pods = pods
}

func (a *activePods) add(pods ...*v1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pods = append(a.pods, pods...)
}

// remove takes the pods with these UIDs out of the list.
func (a *activePods) remove(uids ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pods = slices.DeleteFunc(a.pods, func(p *v1.Pod) bool { return slices.Contains(uids, string(p.UID)) })
}

type readyFlag struct{ v atomic.Bool }

func (r *readyFlag) AllReady() bool { return r.v.Load() }

// env is one manager on its own directory with a fake clock.
type env struct {
	dir   string
	clock *clocktesting.FakeClock
	opts  devicemanager.Options
	mgr   *devicemanager.ManagerImpl
	pods  *activePods
	ready *readyFlag
}

func newEnv(t *testing.T, mod func(*devicemanager.Options)) *env {
	t.Helper()
	e := &env{
		dir:   tempDir(t),
		clock: clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		pods:  &activePods{},
		ready: &readyFlag{},
	}
	e.ready.v.Store(true)
	e.opts = devicemanager.Options{SocketDir: e.dir, Clock: e.clock, DialTimeout: 5 * time.Second}
	if mod != nil {
		mod(&e.opts)
	}
	return e
}

// start builds and starts a manager on e's options.
func (e *env) start(t *testing.T) *devicemanager.ManagerImpl {
	t.Helper()
	return e.startWith(t, nil, nil)
}

func (e *env) startWith(t *testing.T, initial podstate.ContainerMap, running sets.Set[string]) *devicemanager.ManagerImpl {
	t.Helper()
	m, err := devicemanager.NewManagerImpl(e.opts)
	require.NoError(t, err)
	require.NoError(t, m.Start(e.pods.get, e.ready, initial, running))
	t.Cleanup(func() { _ = m.Stop() })
	e.mgr = m
	return m
}

// plugin starts a fake plugin in the socket dir and registers it; it waits
// until the manager reports the resource with the expected device counts.
func (e *env) plugin(t *testing.T, name, res string, opts *pluginapi.DevicePluginOptions, devs ...*pluginapi.Device) *fakePlugin {
	t.Helper()
	p := newFakePlugin(t, e.dir, name, res, opts, devs...)
	p.start(t)
	require.NoError(t, registerPlugin(t, e.dir, p))
	h, all := countHealth(devs)
	e.waitCapacity(t, res, all, h)
	return p
}

func countHealth(devs []*pluginapi.Device) (healthyN, all int64) {
	seen := map[string]bool{}
	for _, d := range devs {
		if seen[d.ID] {
			continue
		}
		seen[d.ID] = true
		all++
		if d.Health == pluginapi.Healthy {
			healthyN++
		}
	}
	return healthyN, all
}

// capacityOf returns capacity and allocatable of res and whether it is listed.
func capacityOf(m *devicemanager.ManagerImpl, res string) (capacity, allocatable int64, listed bool) {
	c, a, _ := m.GetCapacity()
	q, ok := c[v1.ResourceName(res)]
	if ok {
		capacity = q.Value()
	}
	if qa, ok2 := a[v1.ResourceName(res)]; ok2 {
		allocatable = qa.Value()
	}
	return capacity, allocatable, ok
}

func (e *env) waitCapacity(t *testing.T, res string, capacity, allocatable int64) {
	t.Helper()
	e.waitCapacityWithin(t, waitFor, res, capacity, allocatable)
}

// waitCapacityWithin is waitCapacity with its own limit, for work that takes
// longer than the usual waits.
func (e *env) waitCapacityWithin(t *testing.T, limit time.Duration, res string, capacity, allocatable int64) {
	t.Helper()
	require.Eventuallyf(t, func() bool {
		c, a, ok := capacityOf(e.mgr, res)
		return ok && c == capacity && a == allocatable
	}, limit, tick, "resource %s never reached capacity %d allocatable %d", res, capacity, allocatable)
}

// pod builds a pod; containers come from ctr.
func pod(uid string, containers ...v1.Container) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: "pod-" + uid, Namespace: "default"},
		Spec:       v1.PodSpec{Containers: containers},
	}
}

// ctr builds a container whose limits (and requests) are the given counts;
// pairs of resource name and quantity.
func ctr(name string, kv ...any) v1.Container {
	limits := v1.ResourceList{}
	for i := 0; i+1 < len(kv); i += 2 {
		limits[v1.ResourceName(kv[i].(string))] = *resource.NewQuantity(int64(kv[i+1].(int)), resource.DecimalSI)
	}
	return v1.Container{
		Name:      name,
		Resources: v1.ResourceRequirements{Limits: limits, Requests: limits.DeepCopy()},
	}
}

func sidecar(c v1.Container) v1.Container {
	always := v1.ContainerRestartPolicyAlways
	c.RestartPolicy = &always
	return c
}

// ids returns the sorted device IDs held by a container for res.
func ids(m *devicemanager.ManagerImpl, podUID, container, res string) []string {
	devs := m.GetDevices(podUID, container)
	return sets.List(sets.KeySet(devs[res]))
}

// readCheckpoint decodes and verifies the checkpoint in dir.
func readCheckpoint(t *testing.T, dir string) ([]checkpoint.PodDevicesEntry, map[string][]string) {
	t.Helper()
	cm, err := checkpoint.NewManager(dir)
	require.NoError(t, err)
	cp := checkpoint.New(nil, nil)
	require.NoError(t, cm.GetCheckpoint(checkpoint.DeviceManagerKey, cp))
	require.NoError(t, cp.VerifyChecksum())
	return cp.GetData()
}

// tryReadCheckpoint is readCheckpoint for conditions polled by Eventually:
// any failure is reported as ok == false.
func tryReadCheckpoint(dir string) (entries []checkpoint.PodDevicesEntry, reg map[string][]string, ok bool) {
	cm, err := checkpoint.NewManager(dir)
	if err != nil {
		return nil, nil, false
	}
	cp := checkpoint.New(nil, nil)
	if cm.GetCheckpoint(checkpoint.DeviceManagerKey, cp) != nil || cp.VerifyChecksum() != nil {
		return nil, nil, false
	}
	entries, reg = cp.GetData()
	return entries, reg, true
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// allocate makes p active (once) and admits its container named name.
func (e *env) allocate(p *v1.Pod, name string) error {
	e.pods.mu.Lock()
	found := false
	for _, q := range e.pods.pods {
		if q.UID == p.UID {
			found = true
		}
	}
	if !found {
		e.pods.pods = append(e.pods.pods, p)
	}
	e.pods.mu.Unlock()
	return e.mgr.Allocate(context.Background(), p, findContainer(p, name))
}

func findContainer(p *v1.Pod, name string) *v1.Container {
	for i := range p.Spec.InitContainers {
		if p.Spec.InitContainers[i].Name == name {
			return &p.Spec.InitContainers[i]
		}
	}
	for i := range p.Spec.Containers {
		if p.Spec.Containers[i].Name == name {
			return &p.Spec.Containers[i]
		}
	}
	panic("no container " + name)
}

func (e *env) runOptions(p *v1.Pod, name string) (*devicemanager.DeviceRunContainerOptions, error) {
	return e.mgr.GetDeviceRunContainerOptions(context.Background(), p, findContainer(p, name))
}

// waitAllocatable waits until the allocatable devices of res are exactly want.
func (e *env) waitAllocatable(t *testing.T, res string, want ...string) {
	t.Helper()
	slices.Sort(want)
	require.Eventuallyf(t, func() bool {
		return slices.Equal(keys(e.mgr.GetAllocatableDevices()[res]), want)
	}, waitFor, tick, "allocatable devices of %s never became %v", res, want)
}
