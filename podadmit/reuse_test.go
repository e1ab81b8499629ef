package podadmit_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/podadmit"
)

func newAgent(t *testing.T, gpus int) *agent {
	t.Helper()
	a, err := startAgent(gpus)
	require.NoError(t, err)
	t.Cleanup(a.stop)
	return a
}

func podOf(uid string, inits []v1.Container, apps ...v1.Container) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: uid, UID: k8stypes.UID("uid-" + uid)},
		Spec:       v1.PodSpec{InitContainers: inits, Containers: apps},
	}
}

// devicesByContainer returns the gpus each container of a got.
func devicesByContainer(a *podadmit.Admission) map[string][]string {
	out := map[string][]string{}
	for _, c := range a.Containers {
		out[c.Name] = c.Devices[gpu]
	}
	return out
}

// A regular init container has finished before the app containers start:
// they may be given its devices.
func TestAppContainersReuseTheDevicesOfARegularInitContainer(t *testing.T) {
	ag := newAgent(t, 2)
	pod := podOf("job", []v1.Container{gpus("setup", 2)}, gpus("train", 2))

	a, err := ag.adm.Admit(context.Background(), pod)
	require.NoError(t, err)
	got := devicesByContainer(a)
	assert.Equal(t, []string{"gpu-0", "gpu-1"}, got["setup"])
	assert.Equal(t, []string{"gpu-0", "gpu-1"}, got["train"], "the init container's devices, again")
	assert.Equal(t, 2, gpuStatus(ag.mgr).Allocated)
}

// A sidecar runs beside the app containers: it may take a regular init
// container's devices, but keeps them; the app containers get others.
func TestSidecarKeepsItsDevicesWhileAppContainersRun(t *testing.T) {
	ag := newAgent(t, 3)
	pod := podOf("job", []v1.Container{gpus("setup", 3), sidecar("agent", 1)}, gpus("train", 2))

	a, err := ag.adm.Admit(context.Background(), pod)
	require.NoError(t, err)
	got := devicesByContainer(a)
	require.Len(t, got["agent"], 1)
	require.Len(t, got["train"], 2)
	assert.Subset(t, got["setup"], got["agent"], "the sidecar reuses a device of the init container")
	assert.Subset(t, got["setup"], got["train"])
	assert.False(t, sets.New(got["train"]...).HasAny(got["agent"]...), "the app container never gets the sidecar's device")
	assert.Equal(t, 3, gpuStatus(ag.mgr).Allocated)

	require.True(t, ag.adm.Release(a.UID))
	assert.Equal(t, 0, gpuStatus(ag.mgr).Allocated, "released")
}

// A sidecar's devices are its own even when a regular init container comes
// after it: only that init container's devices go to the app container.
func TestSidecarBeforeAnInitContainerKeepsItsDevices(t *testing.T) {
	ag := newAgent(t, 3)
	pod := podOf("job", []v1.Container{sidecar("agent", 1), gpus("setup", 2)}, gpus("train", 2))

	a, err := ag.adm.Admit(context.Background(), pod)
	require.NoError(t, err)
	got := devicesByContainer(a)
	assert.Equal(t, map[string][]string{
		"agent": {"gpu-0"},
		"setup": {"gpu-1", "gpu-2"},
		"train": {"gpu-1", "gpu-2"},
	}, got)
	assert.Equal(t, []string{"agent", "setup", "train"}, containerNames(a), "init containers first, in spec order")
}

// When the sidecar's device is the one the app container would need, the
// pod is refused and holds nothing: all containers or none.
func TestPodIsRefusedWhenTheSidecarsDevicesWouldBeNeeded(t *testing.T) {
	ag := newAgent(t, 3)
	pod := podOf("job", []v1.Container{gpus("setup", 3), sidecar("agent", 1)}, gpus("train", 3))

	_, err := ag.adm.Admit(context.Background(), pod)
	var ae *podadmit.AdmitError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, "train", ae.Container)
	require.ErrorIs(t, err, devicemanager.ErrInsufficientDevices)
	assert.Equal(t, 0, gpuStatus(ag.mgr).Allocated, "what setup and agent got is released")
	assert.Empty(t, ag.adm.Pods())
	assert.Empty(t, ag.adm.ActivePods())

	// The devices are free for the next pod.
	_, err = ag.adm.Admit(context.Background(), podOf("next", nil, gpus("all", 3)))
	require.NoError(t, err)
}

func containerNames(a *podadmit.Admission) []string {
	var out []string
	for _, c := range a.Containers {
		out = append(out, c.Name)
	}
	return out
}
