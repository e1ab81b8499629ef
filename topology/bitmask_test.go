package topology

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"
)

// The cases of the kubelet's topologymanager/bitmask tests that concern the
// operations devmgr keeps, on a value type: Add and Remove of the kubelet's
// mutable mask become NewBitMask with Go's | and &^, and Fill the full mask.

func TestNewEmptyBitMask(t *testing.T) {
	var m BitMask
	assert.Equal(t, "00", m.String())
	empty, err := NewBitMask()
	require.NoError(t, err)
	assert.Equal(t, "00", empty.String())
}

func TestNewBitMask(t *testing.T) {
	tests := []struct {
		name    string
		nodes   []int
		want    string
		wantErr bool
	}{
		{name: "bit 0", nodes: []int{0}, want: "01"},
		{name: "bit 1", nodes: []int{1}, want: "10"},
		{name: "bits 0 and 1", nodes: []int{0, 1}, want: "11"},
		{name: "bits 0 and 2", nodes: []int{0, 2}, want: "101"},
		{name: "bit 63", nodes: []int{63}, want: "1" + strings.Repeat("0", 63)},
		{name: "repeated bit", nodes: []int{1, 1}, want: "10"},
		{name: "negative bit", nodes: []int{-1}, wantErr: true},
		{name: "bit 64", nodes: []int{64}, wantErr: true},
		{name: "valid bits then a bad one: no partial mask", nodes: []int{0, 1, 64}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewBitMask(tc.nodes...)
			if tc.wantErr {
				require.ErrorIs(t, err, ErrBitOutOfRange)
				assert.EqualError(t, err, "bit number must be in range 0-63")
				assert.Equal(t, BitMask(0), m)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, m.String())
		})
	}
}

func TestAdd(t *testing.T) {
	tests := []struct {
		name    string
		nodes   []int
		want    string
		wantErr bool
	}{
		{name: "bit 0", nodes: []int{0}, want: "01"},
		{name: "bit 1", nodes: []int{1}, want: "10"},
		{name: "bits 0 and 1", nodes: []int{0, 1}, want: "11"},
		{name: "bits outside 0-63 leave the mask alone", nodes: []int{-1, 64}, want: "00", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var m BitMask
			add, err := NewBitMask(tc.nodes...)
			assert.Equal(t, tc.wantErr, err != nil, "error: %v", err)
			m |= add
			assert.Equal(t, tc.want, m.String())
		})
	}
}

func TestRemove(t *testing.T) {
	tests := []struct {
		name   string
		set    []int
		remove []int
		want   string
	}{
		{name: "set 0, remove 0", set: []int{0}, remove: []int{0}, want: "00"},
		{name: "set 0 and 1, remove 1", set: []int{0, 1}, remove: []int{1}, want: "01"},
		{name: "set 0 and 1, remove both", set: []int{0, 1}, remove: []int{0, 1}, want: "00"},
		{name: "set 0, remove bits outside 0-63", set: []int{0}, remove: []int{-1, 64}, want: "01"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := mask(tc.set...)
			rm, _ := NewBitMask(tc.remove...) // out of range: empty, nothing removed
			assert.Equal(t, tc.want, (m &^ rm).String())
		})
	}
}

func TestFullMask(t *testing.T) {
	full := ^BitMask(0)
	assert.Equal(t, strings.Repeat("1", 64), full.String())
	assert.Equal(t, 64, full.Count())
	assert.Equal(t, seqNodes(64), full.GetBits())
	assert.Equal(t, full, mask(seqNodes(64)...))
}

func TestIsEmpty(t *testing.T) {
	tests := []struct {
		nodes []int
		want  bool
	}{
		{nodes: nil, want: true},
		{nodes: []int{0}, want: false},
		{nodes: []int{0, 1}, want: false},
		{nodes: []int{63}, want: false},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, mask(tc.nodes...).IsEmpty(), "mask %v", tc.nodes)
	}
}

func TestIsSet(t *testing.T) {
	tests := []struct {
		name  string
		nodes []int
		check int
		want  bool
	}{
		{name: "bit 0 of 00", nodes: nil, check: 0, want: false},
		{name: "bit 0 of 01", nodes: []int{0}, check: 0, want: true},
		{name: "bit 1 of 11", nodes: []int{0, 1}, check: 1, want: true},
		{name: "bit 1 of 01", nodes: []int{0}, check: 1, want: false},
		{name: "bit 63", nodes: []int{63}, check: 63, want: true},
		{name: "bit 64", nodes: []int{0, 1}, check: 64, want: false},
		{name: "bit -1", nodes: []int{0, 63}, check: -1, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, mask(tc.nodes...).IsSet(tc.check))
		})
	}
}

func TestCount(t *testing.T) {
	tests := []struct {
		nodes []int
		want  int
	}{
		{nodes: nil, want: 0},
		{nodes: []int{0}, want: 1},
		{nodes: []int{0, 1}, want: 2},
		{nodes: []int{0, 33, 63}, want: 3},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, mask(tc.nodes...).Count(), "mask %v", tc.nodes)
	}
}

func TestGetBits(t *testing.T) {
	tests := []struct {
		nodes []int
		want  []int
	}{
		{nodes: nil, want: nil},
		{nodes: []int{0}, want: []int{0}},
		{nodes: []int{0, 1}, want: []int{0, 1}},
		{nodes: []int{63, 5, 34}, want: []int{5, 34, 63}},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, mask(tc.nodes...).GetBits(), "mask %v", tc.nodes)
	}
}

func TestIsNarrowerThan(t *testing.T) {
	tests := []struct {
		name string
		a, b []int
		want bool
	}{
		{name: "fewer bits", a: []int{0}, b: []int{0, 1}, want: true},
		{name: "more bits", a: []int{0, 1}, b: []int{0}, want: false},
		{name: "equal count, lower value", a: []int{0}, b: []int{1}, want: true},
		{name: "equal count, higher value", a: []int{1}, b: []int{0}, want: false},
		{name: "fewer bits but higher value", a: []int{5}, b: []int{0, 1}, want: true},
		{name: "same mask", a: []int{0, 1}, b: []int{0, 1}, want: false},
		{name: "equal count, compared unsigned: node 63 last", a: []int{63}, b: []int{0}, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, mask(tc.a...).IsNarrowerThan(mask(tc.b...)))
		})
	}
}

// eachSubset lists what the reference's recursion lists, every subset once,
// with its size.
func TestEachSubsetMatchesSubsets(t *testing.T) {
	for _, nodes := range [][]int{{5}, {0, 1}, {3, 0, 7, 1}, seqNodes(8), seqNodes(16), {63, 0, 31, 62, 1}} {
		var got []BitMask
		eachSubset(nodes, func(m BitMask, size int) {
			require.Equal(t, m.Count(), size, "size of %v", m)
			got = append(got, m)
		})
		want := subsets(nodes)
		assert.Equal(t, want, got, "%v", nodes)
		assert.Len(t, want, 1<<len(nodes)-1, "%v", nodes)
		assert.Len(t, sets.New(got...), len(got), "%v: masks are distinct", nodes)
	}
}

// The order of hints: eachSubset over the nodes usableNodes keeps, as
// candidateNodes gives them.
func TestEachSubsetOrder(t *testing.T) {
	tests := []struct {
		name  string
		nodes []int
		want  [][]int
	}{
		{name: "none", nodes: nil, want: nil},
		{name: "one", nodes: []int{4}, want: [][]int{{4}}},
		{
			name:  "ascending",
			nodes: []int{0, 1, 2},
			want:  [][]int{{0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}},
		},
		{
			name:  "given order is kept",
			nodes: []int{2, 0, 1},
			want:  [][]int{{2}, {0}, {1}, {2, 0}, {2, 1}, {0, 1}, {0, 1, 2}},
		},
		{
			name:  "four nodes, size 2 and 3 in combination order",
			nodes: []int{0, 1, 2, 3},
			want: [][]int{
				{0}, {1}, {2}, {3},
				{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3},
				{0, 1, 2}, {0, 1, 3}, {0, 2, 3}, {1, 2, 3},
				{0, 1, 2, 3},
			},
		},
		{
			name:  "ids outside 0-63 are skipped",
			nodes: []int{-1, 3, 64, 1, 99},
			want:  [][]int{{3}, {1}, {1, 3}},
		},
		{
			name:  "repeated ids count once",
			nodes: []int{1, 0, 1},
			want:  [][]int{{1}, {0}, {0, 1}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []BitMask
			eachSubset(usableNodes(tc.nodes), func(m BitMask, _ int) { got = append(got, m) })
			var want []BitMask
			for _, nodes := range tc.want {
				want = append(want, mask(nodes...))
			}
			assert.Equal(t, want, got)
		})
	}
}

func TestUsableNodesDoesNotModifyInput(t *testing.T) {
	in := []int{3, 70, 3, 1}
	assert.Equal(t, []int{3, 1}, usableNodes(in))
	assert.Equal(t, []int{3, 70, 3, 1}, in)
}
