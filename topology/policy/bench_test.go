package policy

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/openkubelet/devmgr/topology"
)

// benchHints returns the hints of provider k of four on a machine of n
// nodes: every single node, preferred, and either every pair and the whole
// machine (allMasks false) or every other subset (allMasks true, what
// Census.Hints gives for one device when every node has devices), not
// preferred. When conflicting, provider k prefers only the nodes i with
// i%4 == k, so no permutation is preferred and the merge has to fold the
// masks of every provider.
func benchHints(n, k int, allMasks, conflicting bool) []topology.Hint {
	var hints []topology.Hint
	add := func(m topology.BitMask) {
		preferred := m.Count() == 1 && (!conflicting || m.GetBits()[0]%4 == k)
		hints = append(hints, topology.Hint{NUMANodeAffinity: &m, Preferred: preferred})
	}
	if allMasks {
		for _, m := range everyMask(n) {
			add(m)
		}
		return hints
	}
	nodes := seqNodes(n)
	for _, i := range nodes {
		add(mask(i))
	}
	for i := range nodes {
		for j := i + 1; j < n; j++ {
			add(mask(i, j))
		}
	}
	add(mask(nodes...))
	return hints
}

type policyBench struct {
	name                  string
	nodes                 int
	allMasks, conflicting bool
}

var policyBenches = []policyBench{
	{name: "8nodes-aligned", nodes: 8},
	{name: "8nodes-conflicting", nodes: 8, conflicting: true},
	{name: "16nodes-aligned", nodes: 16},
	{name: "16nodes-conflicting", nodes: 16, conflicting: true},
	{name: "34nodes-aligned", nodes: 34},
	{name: "34nodes-conflicting", nodes: 34, conflicting: true},
	// kubernetes#131738: four providers of 255 hints on eight nodes, 21
	// minutes in the kubelet.
	{name: "8nodes-allmasks-aligned", nodes: 8, allMasks: true},
	{name: "8nodes-allmasks-conflicting", nodes: 8, allMasks: true, conflicting: true},
	{name: "16nodes-allmasks-aligned", nodes: 16, allMasks: true},
	{name: "16nodes-allmasks-conflicting", nodes: 16, allMasks: true, conflicting: true},
}

func (c policyBench) providers() []map[string][]topology.Hint {
	out := make([]map[string][]topology.Hint, 4)
	for k := range out {
		out[k] = map[string][]topology.Hint{fmt.Sprintf("res%d", k): benchHints(c.nodes, k, c.allMasks, c.conflicting)}
	}
	return out
}

// BenchmarkPolicyMerge: four providers; b.ReportMetric gives the hints per
// provider and the permutations the kubelet would enumerate.
func BenchmarkPolicyMerge(b *testing.B) {
	for _, c := range policyBenches {
		provs := c.providers()
		p, err := New(BestEffort, seqNodes(c.nodes))
		if err != nil {
			b.Fatal(err)
		}
		perHint := len(provs[0]["res0"])
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p.Merge(provs)
			}
			b.ReportMetric(float64(perHint), "hints/provider")
			b.ReportMetric(float64(perHint)*float64(perHint)*float64(perHint)*float64(perHint), "permutations")
		})
	}
}

// BenchmarkPolicyMergeNaive is the plain cross product on the smallest case,
// for scale: 37^4 = 1.9 million permutations.
func BenchmarkPolicyMergeNaive(b *testing.B) {
	for _, c := range policyBenches[:2] {
		provs := c.providers()
		rng := rand.New(rand.NewPCG(1, 2))
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				naivePolicyMerge(BestEffort, seqNodes(c.nodes), provs, rng)
			}
		})
	}
}

// TestPolicyBenchInputs pins what the benchmarks measure: node 0, preferred
// unless the providers conflict; on eight nodes, as the plain cross product.
func TestPolicyBenchInputs(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i, c := range policyBenches {
		got, admit := mustPolicy(t, BestEffort, seqNodes(c.nodes)...).Merge(c.providers())
		assert.True(t, admit)
		assert.Equal(t, hint(!c.conflicting, 0), got, c.name)
		if i < 2 {
			want, _ := naivePolicyMerge(BestEffort, seqNodes(c.nodes), c.providers(), rng)
			assert.Equal(t, want, got, c.name)
		}
	}
}
