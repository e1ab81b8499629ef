package topology

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestHintLessThan(t *testing.T) {
	tests := []struct {
		name string
		a, b Hint
		want bool
	}{
		{name: "preferred before not preferred", a: hint(true, 0, 1), b: hint(false, 0), want: true},
		{name: "not preferred after preferred", a: hint(false, 0), b: hint(true, 0, 1), want: false},
		{name: "narrower first", a: hint(true, 1), b: hint(true, 0, 1), want: true},
		{name: "wider after", a: hint(false, 0, 1), b: hint(false, 1), want: false},
		{name: "same width: lower mask first", a: hint(true, 0), b: hint(true, 1), want: true},
		{name: "equal hints", a: hint(true, 0), b: hint(true, 0), want: false},
		{name: "nil affinity after a mask", a: Hint{Preferred: true}, b: hint(true, 0, 1), want: false},
		{name: "mask before nil affinity", a: hint(true, 0, 1), b: Hint{Preferred: true}, want: true},
		{name: "two nil affinities", a: Hint{}, b: Hint{}, want: false},
		{name: "preference wins over nil affinity", a: Hint{Preferred: true}, b: hint(false, 0), want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.a.LessThan(tc.b))
		})
	}
}

func TestHintSort(t *testing.T) {
	hints := []Hint{hint(false, 0, 1), {}, hint(true, 1), hint(false, 0), hint(true, 0)}
	slices.SortStableFunc(hints, func(a, b Hint) int {
		switch {
		case a.LessThan(b):
			return -1
		case b.LessThan(a):
			return 1
		}
		return 0
	})
	assert.Equal(t, []Hint{hint(true, 0), hint(true, 1), hint(false, 0), hint(false, 0, 1), {}}, hints)
}

func TestHintString(t *testing.T) {
	assert.Equal(t, "{01 true}", hint(true, 0).String())
	assert.Equal(t, "{101 false}", hint(false, 0, 2).String())
	assert.Equal(t, "{<nil> false}", Hint{}.String())
}
