package kubeletcompat_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	kubeletdm "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/kubeletcompat"
	"github.com/openkubelet/devmgr/plugintest"
)

const gpu = "example.com/gpu"

// waitFor is how long a test waits for a plugin's devices to arrive.
const waitFor = 10 * time.Second

// logger is what the tests pass where the kubelet's interface takes a
// logger that the adapter does not use.
var logger = logr.Discard()

// testLogger sends logs to the test's log, shown when it fails (or with -v).
func testLogger(t *testing.T) klog.Logger {
	return ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))
}

// shortDir makes a temporary directory with a short path, so that the unix
// sockets in it stay under the 107-byte limit.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kc")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// pods is the active pod list a test hands to a manager.
type pods struct {
	mu   sync.Mutex
	list []*v1.Pod
}

func (p *pods) add(pod *v1.Pod) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.list = append(p.list, pod)
}

func (p *pods) remove(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.list = slices.DeleteFunc(p.list, func(pod *v1.Pod) bool { return string(pod.UID) == uid })
}

func (p *pods) get() []*v1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*v1.Pod(nil), p.list...)
}

// ready is a config.SourcesReady that has seen every source.
type ready struct{}

func (ready) AddSource(string) {}
func (ready) AllReady() bool   { return true }

// numaDevices returns n healthy devices per NUMA node, named gpu-<node>-<i>.
func numaDevices(nodes []int, n int) []*pluginapi.Device {
	var devs []*pluginapi.Device
	for _, node := range nodes {
		for i := range n {
			devs = append(devs, &pluginapi.Device{
				ID:       fmt.Sprintf("gpu-%d-%d", node, i),
				Health:   pluginapi.Healthy,
				Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(node)}}},
			})
		}
	}
	return devs
}

// startPlugin starts a plugin of gpu with devs in dir and registers it on
// dir's kubelet.sock.
func startPlugin(t *testing.T, dir string, devs []*pluginapi.Device) *plugintest.Plugin {
	t.Helper()
	p, err := plugintest.New(plugintest.Options{ResourceName: gpu, SocketDir: dir, Devices: devs, Logger: testLogger(t)})
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	require.NoError(t, p.Start())
	require.NoError(t, p.Register(filepath.Join(dir, devicemanager.KubeletSocketName)))
	return p
}

// capacityGetter is the part of both device managers the waits read.
type capacityGetter interface {
	GetCapacity(klog.Logger) (v1.ResourceList, v1.ResourceList, []string)
}

// waitAllocatable waits until m reports gpu with want allocatable devices.
// The resource must be reported: an absent one is not one at 0.
func waitAllocatable(t *testing.T, m capacityGetter, want int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, allocatable, _ := m.GetCapacity(logger)
		q, ok := allocatable[gpu]
		return ok && q.Value() == want
	}, waitFor, 5*time.Millisecond, "allocatable %s never reached %d", gpu, want)
}

// adapterOn returns a started adapter on dir, with NUMA nodes and the
// topology store, and the active pods it reads.
func adapterOn(t *testing.T, dir string, numa []int, store topologymanager.Store) (*kubeletcompat.Manager, *pods) {
	t.Helper()
	m, err := kubeletcompat.New(devicemanager.Options{SocketDir: dir, NUMANodes: numa, Logger: testLogger(t)}, store)
	require.NoError(t, err)
	active := &pods{}
	require.NoError(t, m.Start(logger, active.get, ready{}, nil, nil))
	t.Cleanup(func() { require.NoError(t, m.Stop(logger)) })
	return m, active
}

// container is a container with limits of gpu (and cpu, memory for the
// Guaranteed class, which the kubelet's topology manager does not need).
func container(name string, gpus int64) v1.Container {
	c := v1.Container{Name: name}
	if gpus > 0 {
		c.Resources.Limits = v1.ResourceList{gpu: *resource.NewQuantity(gpus, resource.DecimalSI)}
	}
	return c
}

func newPod(uid string, init []v1.Container, containers ...v1.Container) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-" + uid, Namespace: "default", UID: types.UID(uid)},
		Spec:       v1.PodSpec{InitContainers: init, Containers: containers},
	}
}

// admitAll allocates every container of pod in the kubelet's order, as the
// kubelet does when its topology manager's policy is none.
func admitAll(ctx context.Context, m kubeletdm.Manager, pod *v1.Pod) error {
	for _, c := range append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if err := m.Allocate(ctx, pod, &c, lifecycle.AddOperation); err != nil {
			return err
		}
	}
	return nil
}

// ids lists the device IDs m holds for the container's gpu, sorted.
func ids(m kubeletdm.Manager, pod *v1.Pod, name string) []string {
	return slices.Sorted(maps.Keys(m.GetDevices(string(pod.UID), name)[gpu]))
}
