package topology

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// nodeDir is where Linux lists NUMA nodes, relative to the sysfs root's parent.
const nodeDir = "sys/devices/system/node"

// Discover returns the machine's NUMA node ids, ascending, read from the
// directories <sysRoot>/sys/devices/system/node/node<N> ("/" on a real host;
// "" means "/"; tests pass a fake tree).
//
// Only directories whose name is "node" followed by a canonical decimal
// number count: "node0", "node12", not "node", "nodeX", "node-1", "node+1",
// "node01" (the kernel never pads), nor a regular file or a symlink named
// like a node. Ids above 63 are returned as read, though BitMask cannot hold
// them.
//
// A machine without NUMA information (the directory is missing, or lists no
// node) is one node: []int{0}. Any other error reading the directory is
// returned with its path.
func Discover(sysRoot string) ([]int, error) {
	if sysRoot == "" {
		sysRoot = "/"
	}
	dir := filepath.Join(sysRoot, nodeDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return []int{0}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading NUMA nodes from %s: %w", dir, err)
	}
	var nodes []int
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if id, ok := parseNodeName(e.Name()); ok {
			nodes = append(nodes, id)
		}
	}
	if len(nodes) == 0 {
		return []int{0}, nil
	}
	slices.Sort(nodes)
	return nodes, nil
}

// parseNodeName returns N for a name "node<N>" with N canonical decimal.
func parseNodeName(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, "node")
	if !ok || digits == "" || (len(digits) > 1 && digits[0] == '0') {
		return 0, false
	}
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	id, err := strconv.Atoi(digits)
	if err != nil { // too large for an int
		return 0, false
	}
	return id, true
}
