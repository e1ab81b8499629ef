package podadmit

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/openkubelet/devmgr/devicemanager"
)

// optsFailing is a fakeManager whose run options fail for the containers
// named in fail.
type optsFailing struct {
	*fakeManager
	fail map[string]error
}

func (o optsFailing) GetDeviceRunContainerOptions(ctx context.Context, pod *v1.Pod, c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	if err := o.fail[c.Name]; err != nil {
		return nil, err
	}
	return o.fakeManager.GetDeviceRunContainerOptions(ctx, pod, c)
}

func TestAdmittedPodsAreCopiesInOrder(t *testing.T) {
	adm, _ := newTestAdmitter()
	for _, uid := range []string{"u2", "u1"} {
		_, err := adm.Admit(context.Background(), &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p-" + uid, UID: types.UID(uid)},
			Spec:       v1.PodSpec{Containers: []v1.Container{container("app", 1)}},
		})
		require.NoError(t, err)
	}
	pods := adm.AdmittedPods()
	require.Len(t, pods, 2)
	assert.Equal(t, "u2", string(pods[0].UID), "admission order")
	assert.Equal(t, "u1", string(pods[1].UID))
	assert.Equal(t, "default", pods[0].Namespace, "the namespace Admit gave")

	pods[0].Name = "changed"
	p, ok := adm.AdmittedPod("u2")
	require.True(t, ok)
	assert.Equal(t, "p-u2", p.Name, "callers get copies")
	_, ok = adm.AdmittedPod("nope")
	assert.False(t, ok)
}

// After a restart, a new Node over a manager that kept its ledger takes the
// pods back: the same answers, active before the first manager call, and
// garbage collection keeps their devices.
func TestRestoreRebuildsAnswersWithoutAllocating(t *testing.T) {
	before, f := newTestAdmitter()
	pod := initAppPlainPod()
	want, err := before.Admit(context.Background(), pod)
	require.NoError(t, err)
	saved := before.AdmittedPods()

	after := New(f) // the manager restored its ledger from the checkpoint
	f.admitter = after
	next := f.next
	require.NoError(t, after.Restore(context.Background(), saved))
	assert.Equal(t, next, f.next, "nothing allocated")
	assert.Equal(t, []Admission{*want}, after.Pods())
	got, ok := after.Pod("u1")
	assert.True(t, ok)
	assert.Equal(t, *want, got)

	f.UpdateAllocatedDevices()
	assert.Contains(t, f.held, "u1", "restored pods are active")
	again, err := after.Admit(context.Background(), pod)
	require.NoError(t, err)
	assert.Equal(t, want, again, "admitting again gives the same answer")

	require.NoError(t, after.Restore(context.Background(), saved), "known pods are skipped")
	assert.Len(t, after.Pods(), 1)
}

func TestRestoreKeepsPodsWhoseRunOptionsFail(t *testing.T) {
	before, f := newTestAdmitter()
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: "u1"},
		Spec:       v1.PodSpec{Containers: []v1.Container{container("a", 1), container("b", 1)}},
	}
	_, err := before.Admit(context.Background(), pod)
	require.NoError(t, err)

	boom := errors.New("endpoint has been stopped")
	after := New(optsFailing{fakeManager: f, fail: map[string]error{"a": boom}})
	f.admitter = after
	err = after.Restore(context.Background(), before.AdmittedPods())
	require.ErrorIs(t, err, boom)
	var ae *AdmitError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, "a", ae.Container)

	got, ok := after.Pod("u1")
	require.True(t, ok, "the pod stays admitted")
	require.Len(t, got.Containers, 2)
	assert.Equal(t, map[string][]string{"example.com/gpu": {"example.com/gpu-0"}}, got.Containers[0].Devices)
	assert.Nil(t, got.Containers[0].RunOptions)
	assert.NotNil(t, got.Containers[1].RunOptions, "later containers are still described")
}

func TestRestoreSkipsInvalidPods(t *testing.T) {
	adm, _ := newTestAdmitter()
	good := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "ok"}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c"}}}}
	err := adm.Restore(context.Background(), []*v1.Pod{
		nil,
		{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c"}}}}, // no UID
		{ObjectMeta: metav1.ObjectMeta{UID: "empty"}},
		good,
	})
	require.ErrorIs(t, err, ErrInvalidPod)
	pods := adm.Pods()
	require.Len(t, pods, 1)
	assert.Equal(t, types.UID("ok"), pods[0].UID)
	assert.Equal(t, "default", pods[0].Namespace)
}

func TestAdmitWhileBeingAdmittedIsRefused(t *testing.T) {
	adm, _ := newTestAdmitter()
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u"}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c"}}}}
	adm.mu.Lock()
	adm.admitting["u"] = pod
	adm.mu.Unlock()
	_, err := adm.Admit(context.Background(), pod)
	assert.ErrorIs(t, err, ErrAdmissionInProgress)
}
