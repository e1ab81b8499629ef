package policy

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/openkubelet/devmgr/topology"
)

// fakeProvider returns the same hints for every container and counts calls.
type fakeProvider struct {
	hints map[string][]topology.Hint
	calls int
}

func (f *fakeProvider) GetTopologyHints(_ *v1.Pod, _ *v1.Container) map[string][]topology.Hint {
	f.calls++
	return f.hints
}

// GetPodTopologyHints makes fakeProvider a PodHintProvider too.
func (f *fakeProvider) GetPodTopologyHints(*v1.Pod) map[string][]topology.Hint {
	f.calls++
	return f.hints
}

func testPod(uid string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}}
}

func TestStoreSetGetRemove(t *testing.T) {
	s := NewStore()
	assert.Equal(t, topology.Hint{}, s.GetAffinity("pod", "ctr"), "unknown container")

	s.SetAffinity("pod", "ctr", hint(true, 1))
	s.SetAffinity("pod", "side", anyHint(true))
	s.SetAffinity("other", "ctr", hint(false, 0, 1))
	assert.Equal(t, hint(true, 1), s.GetAffinity("pod", "ctr"))
	assert.Equal(t, anyHint(true), s.GetAffinity("pod", "side"))
	assert.Equal(t, hint(false, 0, 1), s.GetAffinity("other", "ctr"))
	assert.Equal(t, topology.Hint{}, s.GetAffinity("pod", "missing"))

	s.SetAffinity("pod", "ctr", hint(false, 63))
	assert.Equal(t, hint(false, 63), s.GetAffinity("pod", "ctr"), "replaced")

	s.RemovePod("pod")
	assert.Equal(t, topology.Hint{}, s.GetAffinity("pod", "ctr"))
	assert.Equal(t, topology.Hint{}, s.GetAffinity("pod", "side"))
	assert.Equal(t, hint(false, 0, 1), s.GetAffinity("other", "ctr"), "other pods stay")
	s.RemovePod("never-seen")
}

// TestStoreCopies: a mask given to or taken from the store is not shared.
func TestStoreCopies(t *testing.T) {
	s := NewStore()
	in := hint(true, 0)
	s.SetAffinity("pod", "ctr", in)
	*in.NUMANodeAffinity = mask(1)
	out := s.GetAffinity("pod", "ctr")
	assert.Equal(t, hint(true, 0), out)
	*out.NUMANodeAffinity = mask(2)
	assert.Equal(t, hint(true, 0), s.GetAffinity("pod", "ctr"))
}

// TestStoreConcurrent is for -race: writers, readers and removers of
// overlapping pods at once.
func TestStoreConcurrent(t *testing.T) {
	s := NewStore()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 500 {
				pod := fmt.Sprintf("pod-%d", i%7)
				switch (w + i) % 3 {
				case 0:
					s.SetAffinity(pod, "ctr", hint(i%2 == 0, w%4))
				case 1:
					if h := s.GetAffinity(pod, "ctr"); h.NUMANodeAffinity != nil {
						assert.Equal(t, 1, h.NUMANodeAffinity.Count())
					}
				default:
					s.RemovePod(pod)
				}
			}
		})
	}
	wg.Wait()
}

func TestStoreAdmit(t *testing.T) {
	gpu := &fakeProvider{hints: res("gpu", []topology.Hint{hint(true, 0), hint(true, 1), hint(false, 0, 1)})}
	nic := &fakeProvider{hints: res("nic", []topology.Hint{hint(true, 1), hint(false, 0, 1)})}
	farNIC := &fakeProvider{hints: res("nic", []topology.Hint{hint(false, 0, 1)})}
	pod := testPod("uid-1")
	ctr := &v1.Container{Name: "app"}

	t.Run("admitted: recorded", func(t *testing.T) {
		s := NewStore()
		got, err := s.Admit(mustPolicy(t, Restricted, 0, 1), pod, ctr, gpu, nil, nic)
		require.NoError(t, err)
		assert.Equal(t, hint(true, 1), got)
		assert.Equal(t, hint(true, 1), s.GetAffinity("uid-1", "app"))
	})

	t.Run("refused: typed error, nothing recorded", func(t *testing.T) {
		s := NewStore()
		s.SetAffinity("uid-1", "app", hint(true, 0)) // an earlier admission
		_, err := s.Admit(mustPolicy(t, Restricted, 0, 1), pod, ctr, gpu, farNIC)
		require.Error(t, err)
		assert.EqualError(t, err, "Resources cannot be allocated with Topology locality")
		require.ErrorIs(t, err, &AffinityError{})
		wrapped := fmt.Errorf("admit: %w", err)
		assert.ErrorIs(t, wrapped, &AffinityError{Policy: "other"})
		assert.NotErrorIs(t, errors.New("Resources cannot be allocated with Topology locality"), &AffinityError{})
		var ae *AffinityError
		require.ErrorAs(t, wrapped, &ae)
		assert.Equal(t, AffinityError{Policy: Restricted, PodUID: "uid-1", ContainerName: "app", Hint: hint(false, 0, 1)}, *ae)
		assert.Equal(t, "TopologyAffinityError", ae.Reason())
		assert.Equal(t, hint(true, 0), s.GetAffinity("uid-1", "app"), "the refusal records nothing")
	})

	t.Run("best-effort admits what restricted refuses", func(t *testing.T) {
		s := NewStore()
		got, err := s.Admit(mustPolicy(t, BestEffort, 0, 1), pod, ctr, gpu, farNIC)
		require.NoError(t, err)
		assert.Equal(t, hint(false, 0, 1), got)
		assert.Equal(t, hint(false, 0, 1), s.GetAffinity("uid-1", "app"))
	})

	t.Run("single-numa-node: 'any node' is recorded as no affinity", func(t *testing.T) {
		s := NewStore()
		got, err := s.Admit(mustPolicy(t, SingleNUMANode, 0, 1), pod, ctr, &fakeProvider{})
		require.NoError(t, err)
		assert.Equal(t, anyHint(true), got)
		assert.Equal(t, anyHint(true), s.GetAffinity("uid-1", "app"))
	})

	t.Run("none asks no provider and records nothing", func(t *testing.T) {
		s := NewStore()
		p := &fakeProvider{hints: gpu.hints}
		got, err := s.Admit(mustPolicy(t, None), pod, ctr, p)
		require.NoError(t, err)
		assert.Equal(t, topology.Hint{}, got)
		assert.Zero(t, p.calls)
		assert.Empty(t, s.pods)
	})

	t.Run("nil pod or container", func(t *testing.T) {
		s := NewStore()
		_, err := s.Admit(mustPolicy(t, BestEffort, 0), nil, ctr)
		require.ErrorIs(t, err, ErrNilContainer)
		_, err = s.Admit(mustPolicy(t, BestEffort, 0), pod, nil)
		require.ErrorIs(t, err, ErrNilContainer)
	})
}

// AdmitPod merges the pod's hints once and records the result for every
// init and app container; a refusal records nothing.
func TestStoreAdmitPod(t *testing.T) {
	gpu := &fakeProvider{hints: res("gpu", []topology.Hint{hint(true, 0), hint(true, 1), hint(false, 0, 1)})}
	nic := &fakeProvider{hints: res("nic", []topology.Hint{hint(true, 1), hint(false, 0, 1)})}
	farNIC := &fakeProvider{hints: res("nic", []topology.Hint{hint(false, 0, 1)})}
	pod := testPod("uid-1")
	pod.Spec.InitContainers = []v1.Container{{Name: "init"}}
	pod.Spec.Containers = []v1.Container{{Name: "a"}, {Name: "b"}}

	t.Run("admitted: recorded for every container", func(t *testing.T) {
		s := NewStore()
		calls := gpu.calls
		got, err := s.AdmitPod(mustPolicy(t, Restricted, 0, 1), pod, gpu, nil, nic)
		require.NoError(t, err)
		assert.Equal(t, hint(true, 1), got)
		assert.Equal(t, 1, gpu.calls-calls, "the pod's hints are asked once")
		for _, name := range []string{"init", "a", "b"} {
			assert.Equal(t, hint(true, 1), s.GetAffinity("uid-1", name), name)
		}
	})

	t.Run("refused: typed error naming no container, nothing recorded", func(t *testing.T) {
		s := NewStore()
		_, err := s.AdmitPod(mustPolicy(t, Restricted, 0, 1), pod, gpu, farNIC)
		var ae *AffinityError
		require.ErrorAs(t, err, &ae)
		assert.Equal(t, AffinityError{Policy: Restricted, PodUID: "uid-1", Hint: hint(false, 0, 1)}, *ae)
		assert.Empty(t, s.pods)
	})

	t.Run("none asks no provider and records nothing", func(t *testing.T) {
		s := NewStore()
		p := &fakeProvider{hints: gpu.hints}
		got, err := s.AdmitPod(mustPolicy(t, None), pod, p)
		require.NoError(t, err)
		assert.Equal(t, topology.Hint{}, got)
		assert.Zero(t, p.calls)
		assert.Empty(t, s.pods)
	})

	t.Run("nil pod", func(t *testing.T) {
		_, err := NewStore().AdmitPod(mustPolicy(t, BestEffort, 0), nil)
		require.ErrorIs(t, err, ErrNilContainer)
	})
}
