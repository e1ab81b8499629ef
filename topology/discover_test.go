package topology

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDiscover(t *testing.T) {
	tests := []struct {
		tree string
		want []int
	}{
		{tree: "one-node", want: []int{0}},
		{tree: "two-nodes", want: []int{0, 1}},
		{tree: "sparse", want: []int{0, 2, 5}},
		{tree: "none", want: []int{0}},    // directory without node entries
		{tree: "missing", want: []int{0}}, // no such tree at all
		// node, nodeX, node-1, node+5, node01, node<too big> directories and
		// a regular file node3 are ignored; node12 sorts after node7.
		{tree: "garbage", want: []int{7, 12}},
	}
	for _, tc := range tests {
		t.Run(tc.tree, func(t *testing.T) {
			got, err := Discover(filepath.Join("testdata", "sysfs", tc.tree))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// sysRoot may also be the sysfs mount itself (/sys on a host).
func TestDiscoverFromSysfsMount(t *testing.T) {
	for tree, want := range map[string][]int{"two-nodes": {0, 1}, "sparse": {0, 2, 5}, "none": {0}} {
		t.Run(tree, func(t *testing.T) {
			got, err := Discover(filepath.Join("testdata", "sysfs", tree, "sys"))
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}
}

func TestDiscoverReadError(t *testing.T) {
	tests := []struct {
		name string
		file string // made a regular file, where a directory is expected
	}{
		{name: "node is a file", file: "sys/devices/system/node"},
		{name: "sys is a file", file: "sys"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			path := filepath.Join(root, tc.file)
			require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
			require.NoError(t, os.WriteFile(path, []byte("x"), 0o644))

			got, err := Discover(root)
			require.Error(t, err)
			assert.Nil(t, got)
			assert.Contains(t, err.Error(), filepath.Join(root, "sys/devices/system/node"))
		})
	}
}

func TestDiscoverSymlinkIsNotANode(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "sys/devices/system/node")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "node1"), 0o755))
	require.NoError(t, os.Symlink("node1", filepath.Join(dir, "node4")))

	got, err := Discover(root)
	require.NoError(t, err)
	assert.Equal(t, []int{1}, got)
}

// TestDiscoverHost reads the real /sys: whatever the host, the result is a
// non-empty ascending list.
func TestDiscoverHost(t *testing.T) {
	got, err := Discover("")
	require.NoError(t, err)
	assert.NotEmpty(t, got)
	assert.True(t, slices.IsSorted(got), "%v", got)
}

func TestParseNodeName(t *testing.T) {
	tests := []struct {
		name string
		id   int
		ok   bool
	}{
		{name: "node0", id: 0, ok: true},
		{name: "node7", id: 7, ok: true},
		{name: "node123", id: 123, ok: true},
		{name: "node", ok: false},
		{name: "nodeX", ok: false},
		{name: "node-1", ok: false},
		{name: "node+1", ok: false},
		{name: "node01", ok: false},
		{name: "node1a", ok: false},
		{name: "Node1", ok: false},
		{name: "xnode1", ok: false},
		{name: "node99999999999999999999", ok: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, ok := parseNodeName(tc.name)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.id, id)
		})
	}
}
