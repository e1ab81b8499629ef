package podstate

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/openkubelet/devmgr/checkpoint"
)

// TestLedgerRandomWalk drives the ledger through seeded random sequences of
// reserve, commit, rollback, delete-pod, delete-container and refused
// reservations (no reuse pool) and checks after every step that no device is
// held twice, that the allocated sets are exactly records plus pending
// reservations, and that the owner index agrees with the records.
func TestLedgerRandomWalk(t *testing.T) {
	resources := []string{res1, res2}
	universe := map[string][]string{}
	for _, res := range resources {
		for i := range 8 {
			universe[res] = append(universe[res], fmt.Sprintf("dev%d", i))
		}
	}
	// both resources use the same IDs, to catch leaks across resources
	pods := []string{"p0", "p1", "p2", "p3"}
	ctrs := []string{"c0", "c1"}

	for seed := range uint64(25) {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x5eed))
			l := NewLedger()
			type pendingRes struct {
				rid ReservationID
				key recordKey
			}
			var open []pendingRes
			// order models admission order: each key as first recorded.
			var order []recordKey
			recorded := func(k recordKey) {
				if !slices.Contains(order, k) {
					order = append(order, k)
				}
			}
			pick := func(s []string) string { return s[rng.IntN(len(s))] }
			for step := range 400 {
				var op string
				switch k := rng.IntN(10); {
				case k < 4:
					op = "reserve"
					res := pick(resources)
					var free []string
					for _, id := range universe[res] {
						if !l.IsAllocated(res, id) {
							free = append(free, id)
						}
					}
					rng.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
					n := min(len(free), 1+rng.IntN(3))
					k := recordKey{pick(pods), pick(ctrs), res}
					rid, err := l.Reserve(k.pod, k.container, k.resource, free[:n])
					require.NoError(t, err)
					open = append(open, pendingRes{rid, k})
				case k < 6 && len(open) > 0:
					op = "commit"
					i := rng.IntN(len(open))
					devs := DeviceInstances{}
					for _, id := range universe[res1] {
						devs[id] = numaDev(id, int64(rng.IntN(2)))
					}
					require.NoError(t, l.Commit(open[i].rid, devs, newResp(withEnvs("STEP", fmt.Sprint(step)))))
					recorded(open[i].key)
					open = slices.Delete(open, i, i+1)
				case k < 7 && len(open) > 0:
					op = "rollback"
					i := rng.IntN(len(open))
					require.True(t, l.Rollback(open[i].rid))
					open = slices.Delete(open, i, i+1)
				case k < 8:
					op = "delete-pod"
					pod := pick(pods)
					l.DeletePods(pod)
					order = slices.DeleteFunc(order, func(k recordKey) bool { return k.pod == pod })
				case k < 9:
					op = "delete-container"
					k := recordKey{pick(pods), pick(ctrs), pick(resources)}
					l.DeleteContainerResources(k.pod, k.container, k.resource)
					order = slices.DeleteFunc(order, func(o recordKey) bool { return o == k })
				case k < 10 && rng.IntN(2) == 0:
					op = "insert-without-response"
					res := pick(resources)
					pod, ctr := pick(pods), pick(ctrs)
					var free []string
					for _, id := range universe[res] {
						if !l.IsAllocated(res, id) {
							free = append(free, id)
						}
					}
					l.Insert(pod, ctr, res, checkpoint.DevicesPerNUMA{0: free[:min(len(free), 1)]}, nil)
					recorded(recordKey{pod, ctr, res})
				default:
					op = "refused-reserve"
					res := pick(resources)
					held := sets.List(l.Allocated(res))
					if len(held) == 0 {
						break
					}
					id := pick(held)
					holder := holderPod(l, res, id)
					var other string
					for _, p := range pods {
						if p != holder {
							other = p
							break
						}
					}
					before := l.Allocated(res)
					_, err := l.Reserve(other, pick(ctrs), res, []string{id})
					require.ErrorIs(t, err, ErrDeviceInUse, "step %d", step)
					require.Equal(t, before, l.Allocated(res))
				}
				require.Equal(t, len(open), l.Pending())
				checkInvariants(t, l, resources, order, fmt.Sprintf("seed %d step %d after %s", seed, step, op))
			}
		})
	}
}

// holderPod returns the pod that holds (resource, id), from records or
// reservations, found by walking everything.
func holderPod(l *Ledger, resource, id string) string {
	for uid, ctrs := range l.pods {
		for _, recs := range ctrs {
			if rec := recs[resource]; rec != nil && slices.Contains(rec.ids, id) {
				return uid
			}
		}
	}
	for _, r := range l.pending {
		if r.resource == resource && slices.Contains(r.ids, id) {
			return r.ref.PodUID
		}
	}
	return ""
}

// checkInvariants recomputes by brute force what the index maintains, and
// checks the checkpoint entries against the admission order of the keys.
func checkInvariants(t *testing.T, l *Ledger, resources []string, order []recordKey, where string) {
	t.Helper()
	type key struct{ res, id string }
	holds := map[key]int{}
	owners := map[key][]ContainerRef{}
	reserved := map[key][]ReservationID{}
	var wantWritten []checkpoint.PodDevicesEntry
	unwritable := 0
	for _, k := range order {
		rec := l.pods[k.pod][k.container][k.resource]
		require.NotNil(t, rec, "%s: record %v", where, k)
		if rec.resp == nil {
			unwritable++
			continue
		}
		wantWritten = append(wantWritten, checkpoint.PodDevicesEntry{
			PodUID: k.pod, ContainerName: k.container, ResourceName: k.resource, DeviceIDs: rec.numa, AllocResp: rec.wire,
		})
	}
	records := 0
	for uid, ctrs := range l.pods {
		require.NotEmpty(t, ctrs, "%s: empty pod %s kept", where, uid)
		for name, recs := range ctrs {
			require.NotEmpty(t, recs, "%s: empty container kept", where)
			for res, rec := range recs {
				records++
				all := sets.New[string]()
				for _, ids := range rec.numa {
					all.Insert(ids...)
				}
				require.Equal(t, sets.List(all), rec.ids, where)
				for _, id := range rec.ids {
					k := key{res, id}
					holds[k]++
					owners[k] = append(owners[k], ContainerRef{uid, name})
				}
			}
		}
	}
	for rid, r := range l.pending {
		for _, id := range r.ids {
			k := key{r.resource, id}
			holds[k]++
			reserved[k] = append(reserved[k], rid)
		}
	}
	require.Equal(t, len(order), records, "%s: the model's keys are the records", where)
	entries, err := l.ToCheckpoint()
	require.Equal(t, wantWritten, entries, "%s: checkpoint entries", where)
	if unwritable == 0 {
		require.NoError(t, err, where)
	} else {
		require.ErrorIs(t, err, ErrNoResponse, where)
	}

	for k, n := range holds {
		require.Equal(t, 1, n, "%s: device %v held %d times", where, k, n)
	}
	for _, res := range resources {
		want := sets.New[string]()
		for k := range holds {
			if k.res == res {
				want.Insert(k.id)
			}
		}
		require.Equal(t, want, l.Allocated(res), "%s: allocated %s", where, res)
		require.Equal(t, want.Len(), l.AllocatedCount(res), where)
	}
	for res, devs := range l.index {
		require.NotEmpty(t, devs, "%s: empty resource %s in index", where, res)
		for id, h := range devs {
			k := key{res, id}
			require.False(t, h.empty(), "%s: empty holders for %v", where, k)
			want := owners[k]
			slices.SortFunc(want, compareRefs)
			require.ElementsMatch(t, want, h.owners, "%s: owners of %v", where, k)
			require.Equal(t, want, l.Owners(res, id), where)
			require.ElementsMatch(t, reserved[k], h.reserved, "%s: reservations of %v", where, k)
		}
	}
}
