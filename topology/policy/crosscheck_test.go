package policy

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openkubelet/devmgr/topology"
)

// naivePolicyMerge is the kubelet's policy merge written out plainly: every
// permutation of the providers' hint lists is merged and compared, one after
// another, with the kubelet's case-by-case comparison. The lists and the
// hints inside them are shuffled with rng first: the kubelet reads them from
// maps, in no fixed order, and the decision must not depend on it.
func naivePolicyMerge(name string, machineNodes []int, providersHints []map[string][]topology.Hint, rng *rand.Rand) (topology.Hint, bool) {
	if name == None {
		return topology.Hint{}, true
	}
	machine := mask(machineNodes...)

	var lists [][]topology.Hint
	for _, byResource := range providersHints {
		if len(byResource) == 0 {
			lists = append(lists, []topology.Hint{{Preferred: true}})
			continue
		}
		names := make([]string, 0, len(byResource))
		for r := range byResource {
			names = append(names, r)
		}
		sort.Strings(names)
		for _, r := range names {
			switch hints := byResource[r]; {
			case hints == nil:
				lists = append(lists, []topology.Hint{{Preferred: true}})
			case len(hints) == 0:
				lists = append(lists, []topology.Hint{{Preferred: false}})
			default:
				lists = append(lists, slices.Clone(hints))
			}
		}
	}
	if name == SingleNUMANode {
		for i, hints := range lists {
			var kept []topology.Hint
			for _, h := range hints {
				if h.Preferred && (h.NUMANodeAffinity == nil || h.NUMANodeAffinity.Count() == 1) {
					kept = append(kept, h)
				}
			}
			lists[i] = kept
		}
	}
	rng.Shuffle(len(lists), func(i, j int) { lists[i], lists[j] = lists[j], lists[i] })
	for _, hints := range lists {
		rng.Shuffle(len(hints), func(i, j int) { hints[i], hints[j] = hints[j], hints[i] })
	}

	// The largest, over the lists, of the width of the list's narrowest
	// affinity.
	target := 0
	for _, hints := range lists {
		var narrowest *topology.BitMask
		for _, h := range hints {
			if h.NUMANodeAffinity != nil && (narrowest == nil || h.NUMANodeAffinity.IsNarrowerThan(*narrowest)) {
				narrowest = h.NUMANodeAffinity
			}
		}
		if narrowest != nil && narrowest.Count() > target {
			target = narrowest.Count()
		}
	}

	var best *topology.Hint
	perm := make([]topology.Hint, len(lists))
	var walk func(i int)
	walk = func(i int) {
		if i == len(lists) {
			best = naiveCompare(best, naiveMergePermutation(machine, perm), target)
			return
		}
		for _, h := range lists[i] {
			perm[i] = h
			walk(i + 1)
		}
	}
	walk(0)
	if best == nil {
		best = &topology.Hint{NUMANodeAffinity: &machine}
	}

	result := *best
	switch name {
	case BestEffort:
		return result, true
	case Restricted:
		return result, result.Preferred
	}
	if *result.NUMANodeAffinity == machine {
		result.NUMANodeAffinity = nil
	}
	return result, result.Preferred
}

// naiveMergePermutation ANDs the machine with every affinity of the
// permutation; the result is preferred when every hint is, and every
// affinity is the same mask.
func naiveMergePermutation(machine topology.BitMask, perm []topology.Hint) topology.Hint {
	merged, preferred := machine, true
	var first *topology.BitMask
	for _, h := range perm {
		if !h.Preferred {
			preferred = false
		}
		if h.NUMANodeAffinity == nil {
			continue
		}
		if first == nil {
			first = h.NUMANodeAffinity
		} else if *h.NUMANodeAffinity != *first {
			preferred = false
		}
		merged &= *h.NUMANodeAffinity
	}
	return topology.Hint{NUMANodeAffinity: &merged, Preferred: preferred}
}

// naiveCompare keeps current or takes candidate, case by case as the
// kubelet's HintMerger does.
func naiveCompare(current *topology.Hint, candidate topology.Hint, target int) *topology.Hint {
	cand := candidate.NUMANodeAffinity.Count()
	if cand == 0 {
		return current
	}
	if current == nil {
		return &candidate
	}
	narrower := func() *topology.Hint {
		if *candidate.NUMANodeAffinity == *current.NUMANodeAffinity ||
			current.NUMANodeAffinity.IsNarrowerThan(*candidate.NUMANodeAffinity) {
			return current
		}
		return &candidate
	}
	switch {
	case !current.Preferred && candidate.Preferred:
		return &candidate
	case current.Preferred && !candidate.Preferred:
		return current
	case current.Preferred:
		return narrower()
	}
	cur := current.NUMANodeAffinity.Count()
	switch {
	case cur > target:
		return narrower()
	case cur == target:
		if cand != target {
			return current
		}
		return narrower()
	case cand > target:
		return current
	case cand == target:
		return &candidate
	case cand > cur:
		return &candidate
	case cand < cur:
		return current
	}
	return narrower()
}

// randomPolicyInput draws a machine of one to four nodes among 0..5 and up
// to four providers with up to five hint lists in all, of up to six hints:
// nil and empty maps and lists, hints without affinity, empty masks and
// masks with nodes the machine lacks. Masks come from a small pool so that
// providers often agree.
func randomPolicyInput(rng *rand.Rand) ([]int, []map[string][]topology.Hint) {
	machine := rng.Perm(6)[:1+rng.IntN(4)]
	pool := make([]topology.BitMask, 2+rng.IntN(4))
	for i := range pool {
		for pool[i] == 0 {
			for _, n := range machine {
				if rng.IntN(2) == 0 {
					pool[i] |= mask(n)
				}
			}
			if rng.IntN(5) == 0 {
				pool[i] |= mask(rng.IntN(6))
			}
		}
	}

	lists := 0
	provs := make([]map[string][]topology.Hint, rng.IntN(5))
	for p := range provs {
		switch rng.IntN(10) {
		case 0:
			continue // nil map
		case 1:
			provs[p] = map[string][]topology.Hint{}
			continue
		}
		provs[p] = map[string][]topology.Hint{}
		for r := range 1 + rng.IntN(2) {
			if lists == 5 {
				break
			}
			lists++
			name := fmt.Sprintf("res%d", r)
			switch rng.IntN(10) {
			case 0:
				provs[p][name] = nil
				continue
			case 1:
				provs[p][name] = []topology.Hint{}
				continue
			}
			hints := make([]topology.Hint, 1+rng.IntN(6))
			for i := range hints {
				hints[i].Preferred = rng.IntN(2) == 0
				switch k := rng.IntN(20); {
				case k < 3: // no affinity
				case k == 3:
					hints[i].NUMANodeAffinity = new(topology.BitMask)
				default:
					m := pool[rng.IntN(len(pool))]
					hints[i].NUMANodeAffinity = &m
				}
			}
			provs[p][name] = hints
		}
	}
	return machine, provs
}

func describePolicyInput(machine []int, provs []map[string][]topology.Hint) string {
	var b strings.Builder
	fmt.Fprintf(&b, "machine=%v providers:", machine)
	for _, byResource := range provs {
		if byResource == nil {
			b.WriteString(" nil;")
			continue
		}
		names := make([]string, 0, len(byResource))
		for r := range byResource {
			names = append(names, r)
		}
		sort.Strings(names)
		b.WriteString(" {")
		for _, r := range names {
			if byResource[r] == nil {
				fmt.Fprintf(&b, "%s:nil ", r)
			} else {
				fmt.Fprintf(&b, "%s:%v ", r, byResource[r])
			}
		}
		b.WriteString("};")
	}
	return b.String()
}

// TestPolicyMergeMatchesNaive cross-checks Merge, with every way of folding
// masks, against the plain cross product on seeded random inputs.
func TestPolicyMergeMatchesNaive(t *testing.T) {
	const rounds = 4000
	outcomes := map[string]int{}
	for seed := range uint64(rounds) {
		rng := rand.New(rand.NewPCG(seed, 7))
		machine, provs := randomPolicyInput(rng)
		for _, name := range []string{None, BestEffort, Restricted, SingleNUMANode} {
			want, wantAdmit := naivePolicyMerge(name, machine, provs, rng)
			for _, mode := range []foldMode{foldAuto, foldSparse, foldDense} {
				p := mustPolicy(t, name, machine...)
				if pp, ok := p.(builtin); ok {
					pp.mode = mode
					p = pp
				}
				got, admit := p.Merge(provs)
				require.Equal(t, want, got, "seed %d, %s, mode %d: %s", seed, name, mode, describePolicyInput(machine, provs))
				require.Equal(t, wantAdmit, admit, "seed %d, %s, mode %d", seed, name, mode)
			}
			switch {
			case want.NUMANodeAffinity == nil:
				outcomes[name+" no affinity"]++
			case want.Preferred:
				outcomes[name+" preferred"]++
			case *want.NUMANodeAffinity == mask(machine...):
				outcomes[name+" machine, not preferred"]++
			default:
				outcomes[name+" narrower, not preferred"]++
			}
		}
	}
	// The draw must reach every kind of outcome, not compare fallbacks.
	for _, k := range []string{
		"best-effort preferred", "best-effort machine, not preferred", "best-effort narrower, not preferred",
		"single-numa-node preferred", "single-numa-node no affinity",
	} {
		assert.Greater(t, outcomes[k], rounds/50, "%s: %v", k, outcomes)
	}
	t.Logf("outcomes: %v", outcomes)
}

// TestFoldMasksModes: the subset table and the pairwise fold reach the same
// masks, also where the automatic choice switches to the table.
func TestFoldMasksModes(t *testing.T) {
	sorted := func(ms []topology.BitMask) []topology.BitMask {
		slices.Sort(ms)
		return ms
	}
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 11))
		nodes := rng.Perm(12)[:1+rng.IntN(10)]
		machine := mask(nodes...)
		sets := make([][]topology.BitMask, rng.IntN(5))
		for i := range sets {
			for range 1 + rng.IntN(200) {
				if m := topology.BitMask(rng.Uint64()) & machine; m != 0 && !slices.Contains(sets[i], m) {
					sets[i] = append(sets[i], m)
				}
			}
			if len(sets[i]) == 0 {
				sets[i] = []topology.BitMask{machine}
			}
		}
		want := sorted(foldMasks(machine, sets, foldSparse))
		assert.Equal(t, want, sorted(foldMasks(machine, sets, foldDense)), "seed %d", seed)
		assert.Equal(t, want, sorted(foldMasks(machine, sets, foldAuto)), "seed %d", seed)
	}

	// Every subset of ten nodes, twice: the second step is cheaper on the
	// table, and every subset is reached.
	nodes := seqNodes(10)
	all := everyMask(len(nodes))
	machine := mask(nodes...)
	assert.False(t, useDense(foldAuto, len(nodes), 1, len(all)))
	assert.True(t, useDense(foldAuto, len(nodes), len(all), len(all)))
	assert.False(t, useDense(foldDense, maxDenseNodes+1, 1, 1))
	assert.Len(t, foldMasks(machine, [][]topology.BitMask{all, all}, foldAuto), len(all))

	// Disjoint lists leave nothing, either way.
	disjoint := [][]topology.BitMask{{mask(0)}, {mask(1)}}
	assert.Empty(t, foldMasks(mask(0, 1), disjoint, foldSparse))
	assert.Empty(t, foldMasks(mask(0, 1), disjoint, foldDense))
}
