package podstate

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/topology"
)

func TestReusePoolOps(t *testing.T) {
	l := NewLedger()
	l.Insert("pod", "init", res1, checkpoint.DevicesPerNUMA{0: {"a", "b"}, 1: {"b"}}, newResp())
	l.Insert("pod", "init", res2, checkpoint.DevicesPerNUMA{0: {"x"}}, newResp())
	l.Insert("pod", "app", res1, checkpoint.DevicesPerNUMA{0: {"a"}}, newResp())

	pool := map[string]sets.Set[string]{res1: sets.New("z")}
	l.AddContainerDevices("pod", "init", pool)
	assert.Equal(t, map[string]sets.Set[string]{res1: sets.New("a", "b", "z"), res2: sets.New("x")}, pool)

	l.RemoveContainerDevices("pod", "app", pool)
	assert.Equal(t, map[string]sets.Set[string]{res1: sets.New("b", "z"), res2: sets.New("x")}, pool)

	empty := map[string]sets.Set[string]{}
	l.RemoveContainerDevices("pod", "init", empty)
	assert.Equal(t, map[string]sets.Set[string]{res1: {}, res2: {}}, empty, "like upstream, removal leaves empty sets")

	unknown := map[string]sets.Set[string]{}
	l.AddContainerDevices("nope", "init", unknown)
	l.RemoveContainerDevices("pod", "nope", unknown)
	assert.Empty(t, unknown)
}

// admitter drives one pod's admission the way devicemanager does:
// pre-checks, selection with the reuse pool, reservation, commit, and the
// pool update by container kind. No plugin preference.
type admitter struct {
	l       *Ledger
	pool    map[string]sets.Set[string]
	healthy map[string]sets.Set[string]
}

type kind int

const (
	app kind = iota
	regularInit
	sidecar
)

func (a *admitter) admit(pod, ctr string, k kind, request map[string]int) error {
	var done []string
	for _, res := range slices.Sorted(maps.Keys(request)) {
		needed, err := CheckRequest(RequestCheck{
			PodUID: pod, ContainerName: ctr, Resource: res, Required: request[res],
			Held: a.l.ContainerDevices(pod, ctr, res), Registered: a.healthy[res] != nil, Healthy: a.healthy[res],
		})
		if err == nil && needed > 0 {
			avail := a.healthy[res].Difference(a.l.Allocated(res))
			var picks []string
			picks, err = Select(SelectInput{
				Resource: res, Required: request[res], Needed: needed,
				Reusable: sets.List(a.pool[res]), Available: avail, Tiers: topology.Tiers{NoTopology: sets.List(avail)},
			}, nil)
			if err == nil {
				var rid ReservationID
				if rid, err = a.l.Reserve(pod, ctr, res, picks); err == nil {
					err = a.l.Commit(rid, nil, newResp())
				}
			}
		}
		if err != nil {
			a.l.DeleteContainerResources(pod, ctr, done...)
			return err
		}
		done = append(done, res)
	}
	if k == regularInit {
		a.l.AddContainerDevices(pod, ctr, a.pool)
	} else {
		a.l.RemoveContainerDevices(pod, ctr, a.pool)
	}
	return nil
}

func newAdmitter(devices map[string]int) *admitter {
	a := &admitter{l: NewLedger(), pool: map[string]sets.Set[string]{}, healthy: map[string]sets.Set[string]{}}
	for res, n := range devices {
		a.healthy[res] = sets.New[string]()
		for i := range n {
			a.healthy[res].Insert(fmt.Sprintf("dev%d", i))
		}
	}
	return a
}

// Upstream TestInitContainerDeviceAllocation, in our words.
func TestInitContainerDeviceAllocation(t *testing.T) {
	a := newAdmitter(map[string]int{res1: 4, res2: 2})
	require.NoError(t, a.admit("pod", "init1", regularInit, map[string]int{res1: 1}))
	require.NoError(t, a.admit("pod", "init2", regularInit, map[string]int{res1: 2}))
	require.NoError(t, a.admit("pod", "app1", app, map[string]int{res1: 1, res2: 1}))
	require.NoError(t, a.admit("pod", "app2", app, map[string]int{res1: 1, res2: 1}))

	init1 := a.l.ContainerDevices("pod", "init1", res1)
	init2 := a.l.ContainerDevices("pod", "init2", res1)
	app1 := a.l.ContainerDevices("pod", "app1", res1)
	app2 := a.l.ContainerDevices("pod", "app2", res1)
	assert.Equal(t, 1, init1.Len())
	assert.Equal(t, 2, init2.Len())
	assert.Equal(t, 1, app1.Len())
	assert.Equal(t, 1, app2.Len())
	assert.True(t, init2.IsSuperset(init1))
	assert.True(t, init2.IsSuperset(app1))
	assert.True(t, init2.IsSuperset(app2))
	assert.Empty(t, app1.Intersection(app2), "app containers never share")
	assert.Empty(t, a.l.ContainerDevices("pod", "app1", res2).Intersection(a.l.ContainerDevices("pod", "app2", res2)))
	assert.Equal(t, 2, a.l.AllocatedCount(res1), "shared devices counted once")
	assert.Len(t, a.l.Owners(res1, sets.List(app1)[0]), 3, "init1, init2 and app1 hold it")
}

// Upstream TestRestartableInitContainerDeviceAllocation, in our words.
func TestRestartableInitContainerDeviceAllocation(t *testing.T) {
	a := newAdmitter(map[string]int{res1: 6})
	steps := []struct {
		ctr  string
		kind kind
		n    int
	}{
		{"regular-init", regularInit, 3},
		{"sidecar-a", sidecar, 1},
		{"sidecar-b", sidecar, 2},
		{"app1", app, 1},
		{"app2", app, 2},
	}
	got := map[string]sets.Set[string]{}
	for _, s := range steps {
		require.NoError(t, a.admit("pod", s.ctr, s.kind, map[string]int{res1: s.n}), s.ctr)
		got[s.ctr] = a.l.ContainerDevices("pod", s.ctr, res1)
		assert.Equal(t, s.n, got[s.ctr].Len(), s.ctr)
	}
	assert.True(t, got["regular-init"].IsSuperset(got["sidecar-a"]))
	assert.True(t, got["regular-init"].IsSuperset(got["sidecar-b"]))
	disjoint := []string{"sidecar-a", "sidecar-b", "app1", "app2"}
	for i, x := range disjoint {
		for _, y := range disjoint[i+1:] {
			assert.Empty(t, got[x].Intersection(got[y]), "%s and %s share devices", x, y)
		}
	}
	assert.Equal(t, 6, a.l.AllocatedCount(res1))
}

// A container's admission is all or nothing.
func TestAdmissionAllOrNothing(t *testing.T) {
	a := newAdmitter(map[string]int{res1: 2, res2: 1})
	err := a.admit("pod", "app", app, map[string]int{res1: 2, res2: 2})
	require.ErrorIs(t, err, ErrInsufficientDevices)
	assert.Zero(t, a.l.AllocatedCount(res1), "res1 devices freed after res2 failed")
	assert.False(t, a.l.HasPod("pod"))
	assert.Zero(t, a.l.Pending())
}
