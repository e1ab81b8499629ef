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

// nodeDirs are where Linux lists NUMA nodes: below a root file system that
// has sysfs mounted at /sys, or below the sysfs mount itself.
var nodeDirs = []string{"sys/devices/system/node", "devices/system/node"}

// Discover returns the machine's NUMA node ids, ascending, read from the
// directories <sysRoot>/sys/devices/system/node/node<N> (sysRoot "/" on a
// real host; "" means "/"; tests pass a fake tree). A sysRoot that is the
// sysfs mount itself ("/sys", <sysRoot>/devices/system/node) works too: the
// first of the two layouts that exists is read.
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
	dir := filepath.Join(sysRoot, nodeDirs[0])
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if alt := filepath.Join(sysRoot, nodeDirs[1]); isDir(alt) {
			dir = alt
		}
	}
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

func isDir(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.IsDir()
}
