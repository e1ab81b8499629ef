package podadmit_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podadmit"
	"github.com/openkubelet/devmgr/topology/policy"
)

// numaAgent is an admitter under single-numa-node in the given scope, over
// two NUMA nodes of two gpus each (gpu-0-*, gpu-1-*).
func numaAgent(t *testing.T, podScope bool) (*podadmit.Admitter, *policy.Store) {
	t.Helper()
	dir, err := os.MkdirTemp("", "pa")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	store := policy.NewStore()
	mgr, err := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir, NUMANodes: []int{0, 1}, AffinityStore: store})
	require.NoError(t, err)
	adm := podadmit.New(mgr)
	p, err := policy.New(policy.SingleNUMANode, []int{0, 1})
	require.NoError(t, err)
	if podScope {
		adm.SetPodTopology(store, p, mgr)
	} else {
		adm.SetTopology(store, p, mgr)
	}
	require.NoError(t, mgr.Start(adm.ActivePods, nil, nil, nil))
	t.Cleanup(func() { _ = mgr.Stop() })

	var devs []*pluginapi.Device
	for node := range 2 {
		for i := range 2 {
			devs = append(devs, &pluginapi.Device{ID: fmt.Sprintf("gpu-%d-%d", node, i), Health: pluginapi.Healthy,
				Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(node)}}}})
		}
	}
	plugin, err := plugintest.New(plugintest.Options{ResourceName: gpu, SocketDir: dir, Devices: devs})
	require.NoError(t, err)
	t.Cleanup(plugin.Stop)
	require.NoError(t, plugin.Start())
	require.NoError(t, plugin.Register(filepath.Join(dir, devicemanager.KubeletSocketName)))
	require.Eventually(t, func() bool { return gpuStatus(mgr).Free == 4 }, 10*time.Second, 5*time.Millisecond)
	return adm, store
}

func twoContainerPod(uid string, x, y int64) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: uid, UID: types.UID(uid)},
		Spec: v1.PodSpec{Containers: []v1.Container{gpus("x", x), gpus("y", y)}}}
}

// In the pod scope a pod is placed whole: its containers' requests together
// must fit the policy, and every container gets the same affinity. The
// container scope places each container on its own.
func TestPodTopologyScope(t *testing.T) {
	ctx := context.Background()

	t.Run("container scope: 2 and 1 on two nodes", func(t *testing.T) {
		adm, store := numaAgent(t, false)
		a, err := adm.Admit(ctx, twoContainerPod("p", 2, 1))
		require.NoError(t, err)
		require.Len(t, a.Containers, 2)
		assert.NotEqual(t, store.GetAffinity("p", "x").NUMANodeAffinity, store.GetAffinity("p", "y").NUMANodeAffinity)
	})

	t.Run("pod scope: 2 and 1 fit no single node", func(t *testing.T) {
		adm, store := numaAgent(t, true)
		_, err := adm.Admit(ctx, twoContainerPod("p", 2, 1))
		var admitErr *podadmit.AdmitError
		require.ErrorAs(t, err, &admitErr)
		assert.Empty(t, admitErr.Container, "the pod as a whole is refused")
		assert.ErrorIs(t, err, &policy.AffinityError{})
		assert.EqualError(t, err, "pod: Resources cannot be allocated with Topology locality")
		assert.Equal(t, store.GetAffinity("p", "x"), store.GetAffinity("nobody", "x"), "nothing recorded")
		assert.Empty(t, adm.Pods(), "nothing admitted")
	})

	t.Run("pod scope: 1 and 1 on one node", func(t *testing.T) {
		adm, store := numaAgent(t, true)
		_, err := adm.Admit(ctx, twoContainerPod("first", 1, 0))
		require.NoError(t, err)
		a, err := adm.Admit(ctx, twoContainerPod("p", 1, 1))
		require.NoError(t, err)
		x, y := store.GetAffinity("p", "x"), store.GetAffinity("p", "y")
		require.NotNil(t, x.NUMANodeAffinity)
		assert.Equal(t, x, y)
		assert.Equal(t, []int{1}, x.NUMANodeAffinity.GetBits(), "the node with both devices free")
		assert.Equal(t, map[string][]string{gpu: {"gpu-1-0"}}, a.Containers[0].Devices)
		assert.Equal(t, map[string][]string{gpu: {"gpu-1-1"}}, a.Containers[1].Devices)
	})
}
