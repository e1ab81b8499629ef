package policy

import (
	"cmp"
	"math/bits"
	"slices"

	"github.com/openkubelet/devmgr/topology"
)

// The merge: the kubelet's decision without its cross product.
//
// The kubelet merges every permutation (one hint from each resource's list):
// the merged mask is the machine's nodes AND every non-nil affinity, and the
// merged hint is preferred when every hint of the permutation is preferred
// and all its non-nil affinities are the same mask (as given, before the AND
// with the machine). Merged hints with an empty mask are skipped; the others
// are compared one after another, and the survivor is the answer (the
// machine's nodes, not preferred, when none survives).
//
// That comparison is a total order on (preferred, mask), so the survivor is
// the least merged hint whatever the enumeration order, and only the set of
// distinct merged hints matters:
//   - a preferred hint beats any hint that is not;
//   - between preferred hints, the narrower mask wins (BitMask.IsNarrowerThan);
//   - between hints that are not preferred, with target the largest, over
//     the lists, of the fewest nodes of a list's non-nil affinities: a mask
//     of exactly target nodes wins, then masks of fewer nodes (the more nodes,
//     the better), then masks of more (the fewer, the better); equal counts
//     go to the lower value.
//
// So the merge needs two sets, each computed without the cross product:
//   - Preferred merged masks: a permutation is preferred exactly when it
//     takes, from every list, either a preferred hint without affinity or a
//     preferred hint with one common mask M. So M counts when every list
//     offers one of the two, and the all-"any" permutation (machine's nodes)
//     counts when every list offers a preferred hint without affinity. One
//     pass over the hints finds them (bestPreferredMask).
//   - Only when no preferred merged mask is non-empty: every mask the
//     permutations reach. foldMasks folds the lists one at a time and keeps
//     the distinct non-empty masks reached so far (an AND never regrows an
//     empty mask), so a step costs at most (masks so far × masks of the list)
//     intersections, and there are never more masks than subsets of the
//     machine's nodes. For machines of up to maxDenseNodes nodes a step whose
//     pairwise cost would exceed it is done instead on a table of all 2^n
//     subsets (denseMasks), in O(n·2^n) whatever the list sizes.

// mergeHintLists returns the hint the kubelet's merge chooses over the
// cross product of lists; machine must not be empty.
func mergeHintLists(machine topology.BitMask, lists [][]topology.Hint, mode foldMode) topology.Hint {
	for _, hints := range lists {
		if len(hints) == 0 { // no permutation at all
			return topology.Hint{NUMANodeAffinity: &machine}
		}
	}
	if m, ok := bestPreferredMask(machine, lists); ok {
		return topology.Hint{NUMANodeAffinity: &m, Preferred: true}
	}
	m, ok := bestNotPreferredMask(machine, lists, mode)
	if !ok {
		m = machine
	}
	return topology.Hint{NUMANodeAffinity: &m}
}

// bestPreferredMask returns the narrowest non-empty merged mask of a
// preferred permutation, if there is one.
func bestPreferredMask(machine topology.BitMask, lists [][]topology.Hint) (topology.BitMask, bool) {
	// For each mask offered as a preferred hint: how many of the lists
	// lacking a preferred "any" hint offer it, and the last list (1-based)
	// counted, so a list offering it twice counts once.
	type offer struct{ strictLists, lastList int }
	offers := make(map[topology.BitMask]offer)
	strict := 0 // lists without a preferred hint without affinity
	for i, hints := range lists {
		free := slices.ContainsFunc(hints, func(h topology.Hint) bool {
			return h.Preferred && h.NUMANodeAffinity == nil
		})
		if !free {
			strict++
		}
		for _, h := range hints {
			if !h.Preferred || h.NUMANodeAffinity == nil {
				continue
			}
			m := *h.NUMANodeAffinity
			o := offers[m]
			if o.lastList == i+1 {
				continue
			}
			o.lastList = i + 1
			if !free {
				o.strictLists++
			}
			offers[m] = o
		}
	}

	var best topology.BitMask
	found := strict == 0 // every list can pick "any": the machine's nodes
	if found {
		best = machine
	}
	for m, o := range offers {
		if o.strictLists != strict {
			continue
		}
		if merged := m & machine; merged != 0 && (!found || merged.IsNarrowerThan(best)) {
			best, found = merged, true
		}
	}
	return best, found
}

// bestNotPreferredMask returns the best non-empty merged mask of any
// permutation by the order for hints that are not preferred, if there is one.
func bestNotPreferredMask(machine topology.BitMask, lists [][]topology.Hint, mode foldMode) (topology.BitMask, bool) {
	sets, ok := listMasks(machine, lists)
	if !ok {
		return 0, false
	}
	masks := foldMasks(machine, sets, mode)
	if len(masks) == 0 {
		return 0, false
	}
	target := notPreferredTarget(lists)
	best := masks[0]
	for _, m := range masks[1:] {
		if beatsNotPreferred(m, best, target) {
			best = m
		}
	}
	return best, true
}

// listMasks returns, for each list, the distinct non-empty masks its hints
// contribute to an AND (the machine's nodes for a hint without affinity),
// smallest lists first. Lists that contribute only the machine's nodes
// change nothing and are left out. It reports false when a list contributes
// no non-empty mask: then every merged mask is empty.
func listMasks(machine topology.BitMask, lists [][]topology.Hint) ([][]topology.BitMask, bool) {
	sets := make([][]topology.BitMask, 0, len(lists))
	seen := make(map[topology.BitMask]struct{})
	for _, hints := range lists {
		clear(seen)
		set := make([]topology.BitMask, 0, len(hints))
		for _, h := range hints {
			m := machine
			if h.NUMANodeAffinity != nil {
				m &= *h.NUMANodeAffinity
			}
			if _, dup := seen[m]; dup || m == 0 {
				continue
			}
			seen[m] = struct{}{}
			set = append(set, m)
		}
		switch {
		case len(set) == 0:
			return nil, false
		case len(set) == 1 && set[0] == machine:
			continue
		}
		sets = append(sets, set)
	}
	slices.SortFunc(sets, func(a, b []topology.BitMask) int { return cmp.Compare(len(a), len(b)) })
	return sets, true
}

// notPreferredTarget returns the node count the kubelet aims at among hints
// that are not preferred: the largest, over the lists, of the fewest nodes
// among a list's non-nil affinities (as given); 0 when no list has one.
func notPreferredTarget(lists [][]topology.Hint) int {
	target := 0
	for _, hints := range lists {
		fewest := -1
		for _, h := range hints {
			if h.NUMANodeAffinity == nil {
				continue
			}
			if c := h.NUMANodeAffinity.Count(); fewest < 0 || c < fewest {
				fewest = c
			}
		}
		target = max(target, fewest)
	}
	return target
}

// beatsNotPreferred reports whether merged mask a is better than b when
// neither is preferred: by distanceRank of their counts, then by value.
func beatsNotPreferred(a, b topology.BitMask, target int) bool {
	ra, rb := distanceRank(a.Count(), target), distanceRank(b.Count(), target)
	if ra != rb {
		return ra < rb
	}
	return a < b
}

// distanceRank ranks a node count against target, lower is better: target
// itself, then the counts below it from the largest down, then the counts
// above it from the smallest up (counts are at most 64).
func distanceRank(count, target int) int {
	switch {
	case count == target:
		return 0
	case count < target:
		return target - count
	}
	return 64 + count
}

// foldMode chooses how foldMasks intersects; tests force each way.
type foldMode uint8

const (
	foldAuto   foldMode = iota // per step, whichever is estimated cheaper
	foldSparse                 // always pairwise
	foldDense                  // the subset table whenever the machine allows
)

// maxDenseNodes bounds the subset table: 2^20 counters of 8 bytes, twice,
// is 16 MiB, taken only when the pairwise step would cost more.
const maxDenseNodes = 20

// foldMasks returns the distinct non-empty masks machine AND one mask of
// each set, in no particular order; nil when there is none.
func foldMasks(machine topology.BitMask, sets [][]topology.BitMask, mode foldMode) []topology.BitMask {
	n := machine.Count()
	cur, next := []topology.BitMask{machine}, []topology.BitMask(nil)
	seen := make(map[topology.BitMask]struct{})
	var table *denseMasks
	for _, set := range sets {
		if table == nil && useDense(mode, n, len(cur), len(set)) {
			table = newDenseMasks(machine, cur)
		}
		if table != nil {
			if !table.and(set) {
				return nil
			}
			continue
		}
		cur, next = andPairwise(next, cur, set, seen), cur
		if len(cur) == 0 {
			return nil
		}
	}
	if table != nil {
		return table.members()
	}
	return cur
}

// useDense reports whether a step from a masks by a set of b masks should
// use the subset table of a machine of n nodes.
func useDense(mode foldMode, n, a, b int) bool {
	switch {
	case n > maxDenseNodes || mode == foldSparse:
		return false
	case mode == foldDense:
		return true
	}
	// Three transforms of n·2^(n-1) additions and a few passes over the
	// table, against a·b intersections and lookups.
	return a*b > (3*n/2+4)<<n
}

// andPairwise writes into dst the distinct non-empty s AND e for s in cur
// and e in set, using seen as scratch, and returns it.
func andPairwise(dst, cur, set []topology.BitMask, seen map[topology.BitMask]struct{}) []topology.BitMask {
	clear(seen)
	dst = dst[:0]
	for _, s := range cur {
		for _, e := range set {
			m := s & e
			if m == 0 {
				continue
			}
			if _, dup := seen[m]; dup {
				continue
			}
			seen[m] = struct{}{}
			dst = append(dst, m)
		}
	}
	return dst
}

// denseMasks is a set of subsets of the machine's n nodes held as a table
// of 2^n entries, a subset indexed by its nodes renumbered 0..n-1 in
// ascending order (which keeps node counts and the order of values).
type denseMasks struct {
	nodes   []int     // bit i of an index stands for node nodes[i]
	slot    [64]uint8 // node id -> its bit in an index
	in      []uint64  // 1 for a member, 0 otherwise (counts inside and)
	scratch []uint64
}

func newDenseMasks(machine topology.BitMask, members []topology.BitMask) *denseMasks {
	d := &denseMasks{nodes: machine.GetBits()}
	for i, node := range d.nodes {
		d.slot[node] = uint8(i)
	}
	d.in = make([]uint64, 1<<len(d.nodes))
	d.scratch = make([]uint64, len(d.in))
	for _, m := range members {
		d.in[d.index(m)] = 1
	}
	return d
}

// index renumbers a subset of the machine's nodes.
func (d *denseMasks) index(m topology.BitMask) int {
	x := 0
	for rest := uint64(m); rest != 0; rest &= rest - 1 {
		x |= 1 << d.slot[bits.TrailingZeros64(rest)]
	}
	return x
}

// mask undoes index.
func (d *denseMasks) mask(x int) topology.BitMask {
	var m topology.BitMask
	for rest := uint(x); rest != 0; rest &= rest - 1 {
		m |= topology.BitMask(1) << d.nodes[bits.TrailingZeros(rest)]
	}
	return m
}

// and replaces the set with its distinct non-empty intersections with the
// masks of set (subsets of the machine's nodes), and reports whether any is
// left.
//
// With S(X) the number of members containing X and E(X) the number of masks
// of set containing X, S(X)·E(X) counts the pairs whose intersection
// contains X; undoing the superset sums turns that into the number of pairs
// whose intersection is exactly X. The counts stay below 2^(2n) <= 2^40, so
// the wrap-around of uint64 in the intermediate differences is harmless.
func (d *denseMasks) and(set []topology.BitMask) bool {
	clear(d.scratch)
	for _, e := range set {
		d.scratch[d.index(e)] = 1
	}
	supersetSums(d.in)
	supersetSums(d.scratch)
	for x := range d.in {
		d.in[x] *= d.scratch[x]
	}
	supersetDiffs(d.in)
	d.in[0] = 0
	left := false
	for x, pairs := range d.in {
		if pairs != 0 {
			d.in[x] = 1
			left = true
		}
	}
	return left
}

// members returns the masks of the set.
func (d *denseMasks) members() []topology.BitMask {
	var out []topology.BitMask
	for x, in := range d.in {
		if in != 0 {
			out = append(out, d.mask(x))
		}
	}
	return out
}

// supersetSums replaces each f[X] by the sum of f[Y] over the supersets Y of
// X (len(f) is a power of two).
func supersetSums(f []uint64) {
	for step := 1; step < len(f); step <<= 1 {
		for base := 0; base < len(f); base += step << 1 {
			for x := base; x < base+step; x++ {
				f[x] += f[x+step]
			}
		}
	}
}

// supersetDiffs undoes supersetSums.
func supersetDiffs(f []uint64) {
	for step := 1; step < len(f); step <<= 1 {
		for base := 0; base < len(f); base += step << 1 {
			for x := base; x < base+step; x++ {
				f[x] -= f[x+step]
			}
		}
	}
}
