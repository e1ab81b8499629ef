package fdcheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withoutListing drops the listing's own descriptor (target "?"), whose number moves
// when another descriptor takes the one it had.
func withoutListing(fds []string) []string {
	var out []string
	for _, fd := range fds {
		if !strings.HasSuffix(fd, " -> ?") {
			out = append(out, fd)
		}
	}
	return out
}

// A file opened between two snapshots is the one new descriptor, named with
// its path; once it is closed, nothing is new.
func TestSnapshotSeesAnOpenedFile(t *testing.T) {
	before := Snapshot(t)
	path := filepath.Join(t.TempDir(), "leak")
	f, err := os.Create(path)
	require.NoError(t, err)
	opened := withoutListing(New(before, Snapshot(t)))
	require.Len(t, opened, 1)
	assert.True(t, strings.HasSuffix(opened[0], " -> "+path), opened[0])
	require.NoError(t, f.Close())
	assert.Empty(t, withoutListing(New(before, Snapshot(t))))
}
