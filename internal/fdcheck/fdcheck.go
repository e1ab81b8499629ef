// Package fdcheck snapshots the process's open file descriptors, for tests
// that check that nothing leaks one.
package fdcheck

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Snapshot lists /proc/self/fd with each descriptor's target. The listing's
// own descriptor is in it too (with target "?": it is closed by the time of
// the readlink), in every snapshot alike. It fails t when the listing fails.
func Snapshot(t testing.TB) map[string]string {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("list open file descriptors: %v", err)
	}
	out := make(map[string]string, len(entries))
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			target = "?" // closed between the listing and the readlink
		}
		out[e.Name()] = target
	}
	return out
}

// New returns, sorted, the descriptors open in now that were not open (to
// the same target) in before, as "fd -> target", for a failure message.
func New(before, now map[string]string) []string {
	var out []string
	for fd, target := range now {
		if before[fd] != target {
			out = append(out, fd+" -> "+target)
		}
	}
	slices.Sort(out)
	return out
}
