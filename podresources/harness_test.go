package podresources_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podresources"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitTimeout bounds every wait for the manager to observe something.
const waitTimeout = 10 * time.Second

// clientRecvLimit is the receive limit clients of the API customarily use.
const clientRecvLimit = 16 << 20

// node is a device manager with plugins, on a short temp dir, and the pods
// it reports as active.
type node struct {
	t    *testing.T
	dir  string
	mgr  *devicemanager.ManagerImpl
	pods *podList
}

type podList struct {
	mu   sync.Mutex
	pods []*v1.Pod
}

func (l *podList) set(pods ...*v1.Pod) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pods = pods
}

func (l *podList) get() []*v1.Pod {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*v1.Pod(nil), l.pods...)
}

// newNode starts a manager on two NUMA nodes with no plugin yet.
func newNode(t *testing.T) *node {
	t.Helper()
	dir, err := os.MkdirTemp("", "pr")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := &node{t: t, dir: dir, pods: &podList{}}
	n.mgr, err = devicemanager.NewManagerImpl(devicemanager.Options{
		SocketDir: dir,
		NUMANodes: []int{0, 1},
		Logger:    ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(4))),
	})
	require.NoError(t, err)
	require.NoError(t, n.mgr.Start(n.pods.get, nil, nil, nil))
	t.Cleanup(func() { n.mgr.Stop() })
	return n
}

// plugin starts and registers a plugin for res, with GetPreferredAllocation
// (sorted IDs, so allocation is deterministic), and waits until the manager
// has its device list.
func (n *node) plugin(res string, devs []*pluginapi.Device) *plugintest.Plugin {
	n.t.Helper()
	p, err := plugintest.New(plugintest.Options{
		ResourceName: res, SocketDir: n.dir, Devices: devs, GetPreferredAllocationAvailable: true,
		Logger: ktesting.NewLogger(n.t, ktesting.NewConfig(ktesting.Verbosity(2))),
	})
	require.NoError(n.t, err)
	n.t.Cleanup(p.Stop)
	require.NoError(n.t, p.Start())
	require.NoError(n.t, p.Register(filepath.Join(n.dir, devicemanager.KubeletSocketName)))
	n.waitAllocatable(res, healthyIDs(devs)...)
	return p
}

// waitAllocatable waits until the manager's allocatable devices of res are
// exactly ids.
func (n *node) waitAllocatable(res string, ids ...string) {
	n.t.Helper()
	require.Eventually(n.t, func() bool {
		devs, ok := n.mgr.GetAllocatableDevices()[res]
		if !ok || len(devs) != len(ids) {
			return false
		}
		for _, id := range ids {
			if _, ok := devs[id]; !ok {
				return false
			}
		}
		return true
	}, waitTimeout, 5*time.Millisecond, "allocatable %s = %v", res, ids)
}

// admit makes pod active and allocates its containers, init containers
// first, as the kubelet does.
func (n *node) admit(pod *v1.Pod) {
	n.t.Helper()
	n.pods.set(append(n.pods.get(), pod)...)
	ctx := context.Background()
	for i := range pod.Spec.InitContainers {
		require.NoError(n.t, n.mgr.Allocate(ctx, pod, &pod.Spec.InitContainers[i]))
	}
	for i := range pod.Spec.Containers {
		require.NoError(n.t, n.mgr.Allocate(ctx, pod, &pod.Spec.Containers[i]))
	}
}

// serve starts a podresources server for the node and returns it with a
// client connected over its socket.
func (n *node) serve(opts podresources.Options) (*podresources.Server, podresourcesv1.PodResourcesListerClient) {
	n.t.Helper()
	opts.Logger = ktesting.NewLogger(n.t, ktesting.NewConfig(ktesting.Verbosity(4)))
	srv, err := podresources.NewServer(n.mgr, podresources.PodsFunc(n.pods.get), opts)
	require.NoError(n.t, err)
	n.t.Cleanup(func() { assert.NoError(n.t, srv.Stop()) })
	socket := filepath.Join(n.dir, "pod-resources", podresources.SocketName)
	require.NoError(n.t, srv.Start(socket))
	return srv, dial(n.t, socket)
}

// dial connects a real client to the unix socket path.
func dial(t *testing.T, path string) podresourcesv1.PodResourcesListerClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(clientRecvLimit)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return podresourcesv1.NewPodResourcesListerClient(conn)
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

func healthyIDs(devs []*pluginapi.Device) []string {
	var ids []string
	for _, d := range devs {
		if d.Health == pluginapi.Healthy {
			ids = append(ids, d.ID)
		}
	}
	return ids
}

// device returns a healthy device on the given NUMA nodes; no nodes: no
// topology.
func device(id string, nodes ...int64) *pluginapi.Device {
	d := &pluginapi.Device{ID: id, Health: pluginapi.Healthy}
	if len(nodes) > 0 {
		d.Topology = &pluginapi.TopologyInfo{}
		for _, n := range nodes {
			d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: n})
		}
	}
	return d
}

func unhealthy(d *pluginapi.Device) *pluginapi.Device {
	d.Health = pluginapi.Unhealthy
	return d
}

// container returns a container whose limits ask for count devices of each
// resource in limits.
func container(name string, limits map[string]int64) v1.Container {
	c := v1.Container{Name: name}
	if len(limits) > 0 {
		c.Resources.Limits = v1.ResourceList{}
		for res, n := range limits {
			c.Resources.Limits[v1.ResourceName(res)] = *resource.NewQuantity(n, resource.DecimalSI)
		}
	}
	return c
}

func sidecar(c v1.Container) v1.Container {
	always := v1.ContainerRestartPolicyAlways
	c.RestartPolicy = &always
	return c
}

func pod(namespace, name string, uid types.UID, init []v1.Container, containers ...v1.Container) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: uid},
		Spec:       v1.PodSpec{InitContainers: init, Containers: containers},
	}
}

// dev is one expected ContainerDevices; node < 0: no topology.
func dev(res, id string, node int64) *podresourcesv1.ContainerDevices {
	cd := &podresourcesv1.ContainerDevices{ResourceName: res, DeviceIds: []string{id}}
	if node >= 0 {
		cd.Topology = &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: node}}}
	}
	return cd
}

func ctr(name string, devs ...*podresourcesv1.ContainerDevices) *podresourcesv1.ContainerResources {
	return &podresourcesv1.ContainerResources{Name: name, Devices: devs}
}

func podRes(namespace, name string, containers ...*podresourcesv1.ContainerResources) *podresourcesv1.PodResources {
	return &podresourcesv1.PodResources{Namespace: namespace, Name: name, Containers: containers}
}

// assertProto checks two messages are equal, showing both on failure.
func assertProto(t *testing.T, want, got proto.Message, msg string) {
	t.Helper()
	if !proto.Equal(want, got) {
		t.Errorf("%s:\nwant:\n%s\ngot:\n%s", msg,
			prototext.MarshalOptions{Multiline: true}.Format(want),
			prototext.MarshalOptions{Multiline: true}.Format(got))
	}
}
