package policy

import (
	"errors"
	"fmt"

	"github.com/openkubelet/devmgr/topology"
)

// The topology-manager policies, named as the kubelet's
// --topology-manager-policy flag names them.
const (
	// None admits every container and chooses no affinity.
	None = "none"
	// BestEffort admits every container with the best merged hint.
	BestEffort = "best-effort"
	// Restricted admits a container only when the best merged hint is
	// preferred.
	Restricted = "restricted"
	// SingleNUMANode admits a container only when every resource can be
	// placed on one and the same NUMA node (or has no preference).
	SingleNUMANode = "single-numa-node"
)

// ErrUnknown is returned by New for a name that is none of the policy names
// above. The full message is the kubelet's: unknown policy: "name".
var ErrUnknown = errors.New("unknown policy")

// ErrNoNUMANodes is returned by New when a policy other than none is asked
// for a machine without NUMA nodes: such a policy could only refuse
// (restricted, single-numa-node) or choose an empty affinity (best-effort).
var ErrNoNUMANodes = errors.New("topology policy needs at least one NUMA node")

// Policy merges the topology hints of a container's resources into one
// affinity and decides whether the container may be admitted (the kubelet's
// topologymanager.Policy).
//
// The policies decide as the kubelet's v1.37 ones with default policy
// options (no prefer-closest-numa-nodes):
//   - Each resource is one list of hints: its own; a preferred hint without
//     affinity for a nil list or a provider with no resource; a hint
//     without affinity, not preferred, for an empty list.
//   - A permutation (one hint of each list) merges into the machine's nodes
//     ANDed with every affinity of the permutation; the merge is preferred
//     when every hint is, and all the affinities are the same mask.
//   - Of the merges with at least one node, a preferred one wins, the
//     narrowest (topology.BitMask.IsNarrowerThan). Failing that, with
//     target the largest over the lists of a list's fewest nodes: a merge
//     of target nodes, else of fewer (the more the better), else of more
//     (the fewer the better), the lowest mask on a tie. With no such merge: the
//     machine's nodes, not preferred.
//   - best-effort admits that hint; restricted admits it only if preferred.
//     single-numa-node first keeps only the preferred hints with no affinity
//     or one node, then admits only a preferred result, which it reports
//     without affinity when it is the whole machine. none admits Hint{}.
type Policy interface {
	// Name returns the policy's name: None, BestEffort, Restricted or
	// SingleNUMANode.
	Name() string
	// Merge takes one map per hint provider (resource name to hints, as
	// GetTopologyHints returns them) and returns the chosen hint and whether
	// the policy admits it. In a map, a nil hint list means the resource has
	// no preference and an empty one that nothing can satisfy it; a nil or
	// empty map means the provider has no preference at all.
	Merge(providersHints []map[string][]topology.Hint) (topology.Hint, bool)
}

// New returns the policy called name for a machine with the given NUMA
// node ids (in any order; repeats count once).
//
// It fails with ErrUnknown for an unknown name and, for every policy but
// none (which ignores nodes), with ErrNoNUMANodes for an empty node list and
// topology.ErrBitOutOfRange for an id outside 0..63.
//
// Unlike the kubelet, New does not refuse machines with more than eight
// NUMA nodes: that limit (max-allowable-numa-nodes) guards the kubelet's
// exponential merge, and Merge here is not exponential in the number of
// providers (see the package documentation).
func New(name string, numaNodes []int) (Policy, error) {
	switch name {
	case None:
		return builtin{name: name}, nil
	case BestEffort, Restricted, SingleNUMANode:
	default:
		return nil, fmt.Errorf("%w: %q", ErrUnknown, name)
	}
	if len(numaNodes) == 0 {
		return nil, ErrNoNUMANodes
	}
	machine, err := topology.NewBitMask(numaNodes...)
	if err != nil {
		return nil, fmt.Errorf("policy %s, NUMA nodes %v: %w", name, numaNodes, err)
	}
	return builtin{name: name, machine: machine}, nil
}

// builtin is every Policy: the policies differ only in how they filter hints
// before the merge and judge its result. It is an immutable value, safe for
// concurrent use.
type builtin struct {
	name    string
	machine topology.BitMask // the machine's NUMA nodes: the affinity of "any node"
	mode    foldMode
}

// Name returns the policy's name.
func (p builtin) Name() string { return p.name }

// Merge merges the hints as the kubelet's policy of the same name does (see
// Policy for the rules, merge.go for how).
func (p builtin) Merge(providersHints []map[string][]topology.Hint) (topology.Hint, bool) {
	if p.name == None {
		return topology.Hint{}, true
	}
	lists := resourceHintLists(providersHints)
	if p.name == SingleNUMANode {
		lists = singleNodeHints(lists)
	}
	best := mergeHintLists(p.machine, lists, p.mode)
	switch p.name {
	case BestEffort:
		return best, true
	case Restricted:
		return best, best.Preferred
	}
	// single-numa-node: "any node" is reported as no affinity.
	if *best.NUMANodeAffinity == p.machine {
		best.NUMANodeAffinity = nil
	}
	return best, best.Preferred
}

// Hint lists standing for a resource without hints of its own. They are
// shared and never modified.
var (
	anyNodeHints = []topology.Hint{{Preferred: true}} // no preference: any placement is fine
	noNodeHints  = []topology.Hint{{}}                // no placement can satisfy the resource
)

// resourceHintLists flattens the providers' maps into one hint list per
// resource: a provider with no resource contributes one "any node" list, a
// resource with a nil list an "any node" list, and one with an empty list a
// list holding only a non-preferred hint without affinity. The order of the
// lists does not matter to the merge.
func resourceHintLists(providersHints []map[string][]topology.Hint) [][]topology.Hint {
	lists := make([][]topology.Hint, 0, len(providersHints))
	for _, byResource := range providersHints {
		if len(byResource) == 0 {
			lists = append(lists, anyNodeHints)
			continue
		}
		for _, hints := range byResource {
			switch {
			case hints == nil:
				lists = append(lists, anyNodeHints)
			case len(hints) == 0:
				lists = append(lists, noNodeHints)
			default:
				lists = append(lists, hints)
			}
		}
	}
	return lists
}

// singleNodeHints keeps, in each list, the preferred hints that have no
// affinity or exactly one node (as given, before any intersection with the
// machine). A list may end up empty: then nothing can be admitted.
func singleNodeHints(lists [][]topology.Hint) [][]topology.Hint {
	out := make([][]topology.Hint, len(lists))
	for i, hints := range lists {
		kept := make([]topology.Hint, 0, len(hints))
		for _, h := range hints {
			if h.Preferred && (h.NUMANodeAffinity == nil || h.NUMANodeAffinity.Count() == 1) {
				kept = append(kept, h)
			}
		}
		out[i] = kept
	}
	return out
}
