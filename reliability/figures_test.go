//go:build reliability

package reliability

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A figure is recorded together with what the test asserts of it, so that
// no number reaches docs/RELIABILITY.md unchecked: exact for a value the
// test determines, atLeast for a measured one with a floor the test
// requires, atMost for one with a ceiling, param for a setting of the run.

// exact records got as the detail name and asserts that it is want.
func (f *Figures) exact(t testing.TB, name string, got, want int) bool {
	t.Helper()
	f.detail(name, got, "= "+strconv.Itoa(want))
	return assert.Equal(t, want, got, "figure %q", name)
}

// exactText records got as the detail name and asserts that it is want.
func (f *Figures) exactText(t testing.TB, name, got, want string) bool {
	t.Helper()
	f.detail(name, got, "= "+want)
	return assert.Equal(t, want, got, "figure %q", name)
}

// containsText records got as the detail name and asserts that it contains
// part.
func (f *Figures) containsText(t testing.TB, name, got, part string) bool {
	t.Helper()
	f.detail(name, got, "contains "+strconv.Quote(part))
	return assert.Contains(t, got, part, "figure %q", name)
}

// atLeast records got as the detail name and asserts that it is at least
// floor.
func (f *Figures) atLeast(t testing.TB, name string, got, floor int) bool {
	t.Helper()
	f.detail(name, got, ">= "+strconv.Itoa(floor))
	return assert.GreaterOrEqual(t, got, floor, "figure %q", name)
}

// atMost records got as the detail name and asserts that it is at most
// ceiling.
func (f *Figures) atMost(t testing.TB, name string, got, ceiling int) bool {
	t.Helper()
	f.detail(name, got, "<= "+strconv.Itoa(ceiling))
	return assert.LessOrEqual(t, got, ceiling, "figure %q", name)
}

// param records v as a setting of the run under name: context, not a result.
func (f *Figures) param(name string, v any) {
	if f.Params == nil {
		f.Params = map[string]any{}
	}
	f.Params[name] = v
}

func (f *Figures) detail(name string, v any, check string) {
	if f.Details == nil {
		f.Details = map[string]any{}
	}
	if f.Checks == nil {
		f.Checks = map[string]string{}
	}
	f.Details[name] = v
	f.Checks[name] = check
}
