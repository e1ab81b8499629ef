package policy

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openkubelet/devmgr/topology"
)

// anyHint is a hint without affinity.
func anyHint(preferred bool) topology.Hint { return topology.Hint{Preferred: preferred} }

// res is one provider's map: resource name, hints, name, hints, ...
func res(kv ...any) map[string][]topology.Hint {
	m := make(map[string][]topology.Hint, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		hints, _ := kv[i+1].([]topology.Hint)
		m[kv[i].(string)] = hints
	}
	return m
}

func providers(maps ...map[string][]topology.Hint) []map[string][]topology.Hint { return maps }

func mustPolicy(t *testing.T, name string, nodes ...int) Policy {
	t.Helper()
	p, err := New(name, nodes)
	require.NoError(t, err)
	return p
}

// TestPolicyMerge holds the kubelet's policy merge cases (policy_test.go and
// the per-policy tests, v1.37) in spirit, on a four-node machine. merged is
// what best-effort and restricted choose (restricted admits it only when
// preferred); single is single-numa-node's choice, admitted only when
// preferred; none always admits with no affinity.
func TestPolicyMerge(t *testing.T) {
	full := hint(false, 0, 1, 2, 3)
	fullPreferred := hint(true, 0, 1, 2, 3)
	tests := []struct {
		name      string
		providers []map[string][]topology.Hint
		merged    topology.Hint
		single    topology.Hint
	}{
		{name: "no providers", merged: fullPreferred, single: anyHint(true)},
		{name: "a provider with a nil map", providers: providers(nil), merged: fullPreferred, single: anyHint(true)},
		{name: "a provider with an empty map", providers: providers(res()), merged: fullPreferred, single: anyHint(true)},
		{
			name:      "nil hint list: no preference",
			providers: providers(res("gpu", nil)),
			merged:    fullPreferred, single: anyHint(true),
		},
		{
			name:      "empty hint list: cannot be satisfied",
			providers: providers(res("gpu", []topology.Hint{})),
			merged:    full, single: anyHint(false),
		},
		{
			name:      "preferred hint without affinity",
			providers: providers(res("gpu", []topology.Hint{anyHint(true)})),
			merged:    fullPreferred, single: anyHint(true),
		},
		{
			name:      "hint without affinity, not preferred",
			providers: providers(res("gpu", []topology.Hint{anyHint(false)})),
			merged:    full, single: anyHint(false),
		},
		{
			name:      "one provider: the narrowest preferred hint, lowest node first",
			providers: providers(res("gpu", []topology.Hint{hint(true, 1), hint(true, 0), hint(false, 0, 1)})),
			merged:    hint(true, 0), single: hint(true, 0),
		},
		{
			name: "two providers agree",
			providers: providers(
				res("gpu", []topology.Hint{hint(true, 1)}),
				res("nic", []topology.Hint{hint(true, 1)})),
			merged: hint(true, 1), single: hint(true, 1),
		},
		{
			name: "two providers, no common node",
			providers: providers(
				res("gpu", []topology.Hint{hint(true, 0)}),
				res("nic", []topology.Hint{hint(true, 1)})),
			merged: full, single: anyHint(false),
		},
		{
			name: "same node, one hint not preferred",
			providers: providers(
				res("gpu", []topology.Hint{hint(true, 0)}),
				res("nic", []topology.Hint{hint(false, 0)})),
			merged: hint(false, 0), single: anyHint(false),
		},
		{
			// kubernetes#108052: preferred only when the affinities are equal.
			name: "preferred hints of different widths are not aligned",
			providers: providers(
				res("gpu", []topology.Hint{hint(true, 0)}),
				res("nic", []topology.Hint{hint(true, 0, 1)})),
			merged: hint(false, 0), single: anyHint(false),
		},
		{
			name: "two providers, the narrower preferred hint of both",
			providers: providers(
				res("gpu", []topology.Hint{hint(true, 0), hint(true, 1)}),
				res("nic", []topology.Hint{hint(true, 0), hint(false, 0, 1)})),
			merged: hint(true, 0), single: hint(true, 0),
		},
		{
			name: "a wider preferred merge beats a narrower one that is not preferred",
			providers: providers(
				res("gpu", []topology.Hint{hint(true, 1), hint(false, 0, 1)}),
				res("nic", []topology.Hint{hint(true, 0), hint(true, 1), hint(false, 0, 1)})),
			merged: hint(true, 1), single: hint(true, 1),
		},
		{
			name: "several resources of one provider",
			providers: providers(res(
				"gpu", []topology.Hint{hint(true, 1), hint(false, 0, 1)},
				"nic", []topology.Hint{hint(true, 0), hint(true, 1), hint(false, 0, 1)})),
			merged: hint(true, 1), single: hint(true, 1),
		},
		{
			name: "equal widths: the lower mask",
			providers: providers(
				res("gpu", []topology.Hint{hint(true, 0, 2), hint(true, 0, 1)}),
				res("nic", []topology.Hint{hint(true, 0, 2), hint(true, 0, 1)})),
			merged: hint(true, 0, 1), single: anyHint(false),
		},
		{
			name: "a provider without preference does not disturb the others",
			providers: providers(
				res("gpu", []topology.Hint{hint(true, 0), hint(true, 1), hint(false, 0, 1)}),
				nil),
			merged: hint(true, 0), single: hint(true, 0),
		},
		{
			name:      "a resource without preference next to one with hints",
			providers: providers(res("gpu", []topology.Hint{hint(true, 2), hint(false, 2, 3)}, "nic", nil)),
			merged:    hint(true, 2), single: hint(true, 2),
		},
		{
			name: "single-numa-node drops multi-node hints, even preferred ones",
			providers: providers(res(
				"gpu", []topology.Hint{hint(true, 0, 1)},
				"nic", []topology.Hint{hint(true, 0), hint(true, 1), hint(false, 0, 1)})),
			merged: hint(false, 0, 1), single: anyHint(false),
		},
		{
			name: "single-numa-node drops single-node hints that are not preferred",
			providers: providers(
				res("gpu", []topology.Hint{hint(false, 3)}),
				res("nic", []topology.Hint{hint(true, 3)})),
			merged: hint(false, 3), single: anyHint(false),
		},
		{
			name: "a two-node request met by both providers",
			providers: providers(
				res("gpu", []topology.Hint{hint(true, 2, 3), hint(false, 0, 1, 2, 3)}),
				res("nic", []topology.Hint{hint(true, 2, 3)})),
			merged: hint(true, 2, 3), single: anyHint(false),
		},
		// The kubelet's bestNonPreferredAffinityCount cases: no permutation
		// is preferred, so the merge aims at the largest of the providers'
		// narrowest widths (2 here).
		{
			name: "not preferred: the target width (1)",
			providers: providers(
				res("gpu", []topology.Hint{hint(false, 0, 1, 2, 3), hint(false, 0, 1)}),
				res("nic", []topology.Hint{hint(false, 0, 1)})),
			merged: hint(false, 0, 1), single: anyHint(false),
		},
		{
			name: "not preferred: the target width (2)",
			providers: providers(
				res("gpu", []topology.Hint{hint(false, 0, 1, 2, 3), hint(false, 0, 1)}),
				res("nic", []topology.Hint{hint(false, 0, 3)})),
			merged: hint(false, 0, 3), single: anyHint(false),
		},
		{
			name: "not preferred: the target width (3)",
			providers: providers(
				res("gpu", []topology.Hint{hint(false, 0, 1, 2, 3), hint(false, 0, 1)}),
				res("nic", []topology.Hint{hint(false, 1, 2)})),
			merged: hint(false, 1, 2), single: anyHint(false),
		},
		{
			name: "not preferred: the target width (4)",
			providers: providers(
				res("gpu", []topology.Hint{hint(false, 0, 1, 2, 3), hint(false, 0, 1)}),
				res("nic", []topology.Hint{hint(false, 2, 3)})),
			merged: hint(false, 2, 3), single: anyHint(false),
		},
		{
			name: "not preferred: the target width, lowest mask (5)",
			providers: providers(
				res("gpu", []topology.Hint{hint(false, 0, 1, 2, 3), hint(false, 0, 1)}),
				res("nic", []topology.Hint{hint(false, 1, 2), hint(false, 2, 3)})),
			merged: hint(false, 1, 2), single: anyHint(false),
		},
		{
			name: "not preferred: the target width, lowest mask (6)",
			providers: providers(
				res("gpu", []topology.Hint{hint(false, 0, 1, 2, 3), hint(false, 0, 1)}),
				res("nic", []topology.Hint{hint(false, 1, 2, 3), hint(false, 1, 2), hint(false, 1, 3), hint(false, 2, 3)})),
			merged: hint(false, 1, 2), single: anyHint(false),
		},
		{
			name: "not preferred: below the target, the wider merge",
			providers: providers(
				res("gpu", []topology.Hint{hint(false, 0, 1, 2, 3)}),
				res("nic", []topology.Hint{hint(false, 0), hint(false, 1, 2)})),
			merged: hint(false, 1, 2), single: anyHint(false),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, name := range []string{BestEffort, Restricted} {
				got, admit := mustPolicy(t, name, 0, 1, 2, 3).Merge(tc.providers)
				assert.Equal(t, tc.merged, got, name)
				assert.Equal(t, name == BestEffort || tc.merged.Preferred, admit, name)
			}
			got, admit := mustPolicy(t, SingleNUMANode, 0, 1, 2, 3).Merge(tc.providers)
			assert.Equal(t, tc.single, got, SingleNUMANode)
			assert.Equal(t, tc.single.Preferred, admit, SingleNUMANode)

			got, admit = mustPolicy(t, None).Merge(tc.providers)
			assert.Equal(t, topology.Hint{}, got, None)
			assert.True(t, admit, None)
		})
	}
}

// TestPolicyMergeMachine: the machine's nodes bound every affinity.
func TestPolicyMergeMachine(t *testing.T) {
	tests := []struct {
		name      string
		policy    string
		nodes     []int
		providers []map[string][]topology.Hint
		want      topology.Hint
		admit     bool
	}{
		{
			name: "single-numa-node on a one-node machine: the node is 'any node'", policy: SingleNUMANode,
			nodes: []int{0}, providers: providers(res("gpu", []topology.Hint{hint(true, 0)})),
			want: anyHint(true), admit: true,
		},
		{
			name: "nodes the machine lacks are dropped from the merge", policy: Restricted,
			nodes: []int{0, 1}, providers: providers(res("gpu", []topology.Hint{hint(true, 0, 2)}), res("nic", []topology.Hint{hint(true, 0, 2)})),
			want: hint(true, 0), admit: true,
		},
		{
			name: "equal after dropping is not equal: not preferred", policy: Restricted,
			nodes: []int{0, 1}, providers: providers(res("gpu", []topology.Hint{hint(true, 0, 2)}), res("nic", []topology.Hint{hint(true, 0, 3)})),
			want: hint(false, 0), admit: false,
		},
		{
			name: "a hint only on nodes the machine lacks", policy: BestEffort,
			nodes: []int{0, 1}, providers: providers(res("gpu", []topology.Hint{hint(true, 2)})),
			want: hint(false, 0, 1), admit: true,
		},
		{
			name: "an empty mask is not 'any node'", policy: BestEffort,
			nodes: []int{0, 1}, providers: providers(res("gpu", []topology.Hint{hint(true)})),
			want: hint(false, 0, 1), admit: true,
		},
		{
			name: "sparse node ids: 'any node' is the machine's", policy: BestEffort,
			nodes: []int{3, 1, 3}, providers: providers(res("gpu", nil)),
			want: hint(true, 1, 3), admit: true,
		},
		{
			name: "single-numa-node with sparse ids", policy: SingleNUMANode,
			nodes: []int{1, 3}, providers: providers(res("gpu", []topology.Hint{hint(true, 3), hint(true, 1), hint(false, 1, 3)})),
			want: hint(true, 1), admit: true,
		},
		{
			name: "node 63", policy: SingleNUMANode,
			nodes: []int{62, 63}, providers: providers(res("gpu", []topology.Hint{hint(true, 63)}), res("nic", []topology.Hint{hint(true, 63), anyHint(true)})),
			want: hint(true, 63), admit: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, admit := mustPolicy(t, tc.policy, tc.nodes...).Merge(tc.providers)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.admit, admit)
		})
	}
}

func TestNew(t *testing.T) {
	for _, name := range []string{None, BestEffort, Restricted, SingleNUMANode} {
		p, err := New(name, []int{0, 1})
		require.NoError(t, err, name)
		assert.Equal(t, name, p.Name())
	}

	_, err := New("prefer-closest", []int{0})
	require.ErrorIs(t, err, ErrUnknown)
	assert.EqualError(t, err, `unknown policy: "prefer-closest"`)

	_, err = New(Restricted, nil)
	require.ErrorIs(t, err, ErrNoNUMANodes)

	_, err = New(BestEffort, []int{0, 64})
	require.ErrorIs(t, err, topology.ErrBitOutOfRange)

	p, err := New(None, nil)
	require.NoError(t, err, "none ignores the nodes")
	assert.Equal(t, None, p.Name())

	// No eight-node limit: devmgr's merge is not exponential.
	_, err = New(SingleNUMANode, seqNodes(64))
	require.NoError(t, err)
}

// TestMergeLeavesInputAlone: Merge neither changes its arguments nor returns
// memory they share.
func TestMergeLeavesInputAlone(t *testing.T) {
	in := providers(res("gpu", []topology.Hint{hint(true, 0), hint(false, 0, 1)}), res("nic", []topology.Hint{hint(true, 0)}))
	for _, name := range []string{BestEffort, Restricted, SingleNUMANode} {
		got, _ := mustPolicy(t, name, 0, 1).Merge(in)
		require.NotNil(t, got.NUMANodeAffinity, name)
		*got.NUMANodeAffinity = mask(1)
		assert.Equal(t, providers(res("gpu", []topology.Hint{hint(true, 0), hint(false, 0, 1)}), res("nic", []topology.Hint{hint(true, 0)})), in, name)
	}
}

// TestBeatsNotPreferred: the kubelet's comparison of two merged hints that
// are not preferred (its compareHints cases 1, 2, 3a-3cc), as a total order.
func TestBeatsNotPreferred(t *testing.T) {
	tests := []struct {
		name               string
		target             int
		current, candidate []int
		candidateWins      bool
	}{
		{name: "1: current wider than target, candidate narrower", target: 1, current: []int{0, 1}, candidate: []int{0}, candidateWins: true},
		{name: "1: both wider than target, narrower wins", target: 1, current: []int{1, 2}, candidate: []int{0, 1, 2}, candidateWins: false},
		{name: "1: both wider, same width, lower wins", target: 1, current: []int{1, 2}, candidate: []int{0, 2}, candidateWins: true},
		{name: "2: current at target, candidate not", target: 2, current: []int{1, 2}, candidate: []int{0}, candidateWins: false},
		{name: "2: both at target, lower wins", target: 2, current: []int{1, 2}, candidate: []int{0, 1}, candidateWins: true},
		{name: "3a: current below target, candidate above", target: 2, current: []int{1}, candidate: []int{0, 1, 2}, candidateWins: false},
		{name: "3b: current below target, candidate at it", target: 2, current: []int{0}, candidate: []int{1, 2}, candidateWins: true},
		{name: "3ca: both below, candidate wider", target: 3, current: []int{0}, candidate: []int{1, 2}, candidateWins: true},
		{name: "3cb: both below, candidate narrower", target: 3, current: []int{1, 2}, candidate: []int{0}, candidateWins: false},
		{name: "3cc: both below, same width, lower wins", target: 3, current: []int{2}, candidate: []int{1}, candidateWins: true},
		{name: "target 0: narrowest", target: 0, current: []int{0, 1}, candidate: []int{3}, candidateWins: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cur, cand := mask(tc.current...), mask(tc.candidate...)
			assert.Equal(t, tc.candidateWins, beatsNotPreferred(cand, cur, tc.target))
			assert.Equal(t, !tc.candidateWins, beatsNotPreferred(cur, cand, tc.target))
		})
	}
}

func TestNotPreferredTarget(t *testing.T) {
	tests := []struct {
		lists [][]topology.Hint
		want  int
	}{
		{lists: nil, want: 0},
		{lists: [][]topology.Hint{{anyHint(true)}}, want: 0},
		{lists: [][]topology.Hint{{hint(true)}}, want: 0},
		{lists: [][]topology.Hint{{hint(true, 0)}}, want: 1},
		{lists: [][]topology.Hint{{hint(true, 0, 1), hint(true, 0, 1, 2)}}, want: 2},
		{lists: [][]topology.Hint{{hint(true, 0, 1), hint(true, 0, 1, 2)}, {hint(true, 0, 1, 2)}}, want: 3},
		{lists: [][]topology.Hint{{hint(true, 0, 1), anyHint(false)}, {hint(true, 0, 1, 2), hint(true, 0, 1, 2, 3)}}, want: 3},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, notPreferredTarget(tc.lists), "%v", tc.lists)
	}
}
