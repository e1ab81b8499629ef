package podadmit

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// hookedManager records the containers it is asked to allocate, in order,
// and runs during, when set, in its first call.
type hookedManager struct {
	*fakeManager
	during func()
	mu     sync.Mutex
	calls  []string
}

func (h *hookedManager) Allocate(ctx context.Context, pod *v1.Pod, c *v1.Container) error {
	h.mu.Lock()
	h.calls = append(h.calls, string(pod.UID)+"/"+c.Name)
	first := len(h.calls) == 1
	h.mu.Unlock()
	if first && h.during != nil {
		h.during()
	}
	return h.fakeManager.Allocate(ctx, pod, c)
}

func (h *hookedManager) allocated() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.calls...)
}

func newHookedAdmitter() (*Admitter, *hookedManager) {
	h := &hookedManager{fakeManager: &fakeManager{fail: map[string]error{}}}
	adm := New(h)
	h.admitter = adm
	return adm, h
}

func twoStepPod(uid string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)},
		Spec:       v1.PodSpec{InitContainers: []v1.Container{container("init", 1)}, Containers: []v1.Container{container("app", 1)}},
	}
}

// The manager keeps the reusable devices of the pod being admitted only, so
// a second pod's admission waits until the first has ended, as in the
// kubelet, which admits one pod at a time.
func TestPodsAreAdmittedOneAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		adm, h := newHookedAdmitter()
		second := make(chan error, 1)
		h.during = func() {
			go func() {
				_, err := adm.Admit(context.Background(), twoStepPod("b"))
				second <- err
			}()
			// Every goroutine of the test is blocked: the second admission
			// waits for its turn (or, if it did not wait, it has ended).
			synctest.Wait()
			assert.Len(t, adm.ActivePods(), 2, "a pod waiting for its turn is active")
		}
		_, err := adm.Admit(context.Background(), twoStepPod("a"))
		require.NoError(t, err)
		require.NoError(t, <-second)
		assert.Equal(t, []string{"a/init", "a/app", "b/init", "b/app"}, h.allocated())
	})
}

// An admission waiting for its turn gives up when its context ends, and
// leaves nothing behind.
func TestAdmissionWaitingForItsTurnHonoursItsContext(t *testing.T) {
	adm, h := newHookedAdmitter()
	var err error
	h.during = func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err = adm.Admit(ctx, twoStepPod("b"))
	}
	_, errA := adm.Admit(context.Background(), twoStepPod("a"))
	require.NoError(t, errA)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, []string{"a/init", "a/app"}, h.allocated(), "the manager never saw pod b")
	assert.Len(t, adm.ActivePods(), 1)
	_, ok := adm.Pod("b")
	assert.False(t, ok)
}

// A restore waits for the admission in progress too, since run options may
// allocate. If its context ends first, the pods still come back, with their
// devices and without run options, so that nothing they hold is collected.
func TestRestoreWithoutItsTurnKeepsThePodsDevices(t *testing.T) {
	adm, h := newHookedAdmitter()
	before, f := newTestAdmitter()
	_, err := before.Admit(context.Background(), &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: "r"},
		Spec:       v1.PodSpec{Containers: []v1.Container{container("c", 1)}},
	})
	require.NoError(t, err)
	h.held = f.held // the manager restored the ledger
	h.during = func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err = adm.Restore(ctx, before.AdmittedPods())
	}
	_, errA := adm.Admit(context.Background(), twoStepPod("a"))
	require.NoError(t, errA)
	require.ErrorIs(t, err, context.Canceled)
	got, ok := adm.Pod("r")
	require.True(t, ok, "the pod is back")
	require.Len(t, got.Containers, 1)
	assert.Equal(t, map[string][]string{"example.com/gpu": {"example.com/gpu-0"}}, got.Containers[0].Devices)
	assert.Nil(t, got.Containers[0].RunOptions)
}
