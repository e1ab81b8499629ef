//go:build interop

package interop

import (
	"encoding/xml"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// devmgr sanity, the conformance suite, run from the command line against
// the sample plugin as a CI job would run it against a plugin binary.
func TestSanityOnSamplePlugin(t *testing.T) {
	requireUnshare(t)
	devmgr, pluginBin, _ := buildBinaries(t)
	dir, sockDir, pluginTmp := testDirs(t)
	junit := filepath.Join(dir, "sanity.xml")

	// The default --reregister-timeout (60 s) covers the sample plugin's
	// 10 s wait before it registers again.
	sanity := startProcess(t, "devmgr sanity", filepath.Join(dir, "sanity.log"), nil,
		devmgr, "sanity", "--socket-dir", sockDir, "--junit", junit)
	waitFor(t, "devmgr sanity to serve kubelet.sock", 10*time.Second, func() bool {
		fi, err := os.Stat(filepath.Join(sockDir, "kubelet.sock"))
		return err == nil && fi.Mode().Type() == fs.ModeSocket
	}, sanity)
	plugin := startSamplePlugin(t, pluginBin, sockDir, pluginTmp, filepath.Join(dir, "plugin.log"))

	var err error
	select {
	case err = <-sanity.done:
		sanity.done <- err
	case <-time.After(3 * time.Minute):
		t.Logf("plugin log:\n%s", plugin.tail())
		t.Fatalf("devmgr sanity did not finish within 3 minutes; log:\n%s", sanity.tail())
	}
	out, rerr := os.ReadFile(sanity.log)
	require.NoError(t, rerr)
	t.Logf("devmgr sanity --socket-dir %s --junit %s:\n%s", sockDir, junit, out)

	// The sample plugin passes every check that runs. It advertises neither
	// GetPreferredAllocation nor PreStartContainer (its stub is made with
	// both flags false), so those checks are skipped, and the command line
	// has no way to make it send a new list. The restart check waits for
	// its re-registration, which comes once its 10 s poll after kubelet.sock
	// is re-created has restarted its server.
	want := map[string]string{
		"registration/version":              "passed",
		"registration/resource-name":        "passed",
		"registration/endpoint":             "passed",
		"registration/options":              "passed",
		"list-and-watch/first-list":         "passed",
		"list-and-watch/update":             "skipped",
		"list-and-watch/device-ids":         "passed",
		"list-and-watch/health":             "passed",
		"list-and-watch/topology":           "passed",
		"preferred-allocation/subset":       "skipped",
		"preferred-allocation/must-include": "skipped",
		"preferred-allocation/size":         "skipped",
		"allocate/responses":                "passed",
		"allocate/device-specs":             "passed",
		"allocate/envs":                     "passed",
		"allocate/cdi":                      "passed",
		"allocate/mounts":                   "passed",
		"allocate/unknown-device":           "passed",
		"pre-start/answered":                "skipped",
		"concurrency/allocate":              "passed",
		"restart/re-register":               "passed",
	}
	row := regexp.MustCompile(`(?m)^(\S+/\S+)\s+(passed|failed|skipped)\s+\S+$`)
	got := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(out), -1) {
		got[m[1]] = m[2]
	}
	assert.Equal(t, want, got)
	assert.Contains(t, string(out), "\n16 passed, 0 failed, 5 skipped\n")
	assert.Contains(t, string(out), "Checked example.com/resource, registered in "+sockDir+" on endpoint dp.")
	assert.NoError(t, err, "devmgr sanity exits 0: no check failed")

	b, err := os.ReadFile(junit)
	require.NoError(t, err)
	var suite struct {
		Tests    int `xml:"tests,attr"`
		Failures int `xml:"failures,attr"`
		Skipped  int `xml:"skipped,attr"`
	}
	require.NoError(t, xml.Unmarshal(b, &suite), "%s", b)
	assert.Equal(t, []int{len(want), 0, 5}, []int{suite.Tests, suite.Failures, suite.Skipped})

	require.NoError(t, plugin.stop(t))
}
