package main

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// status --wait-for, started before serve, keeps asking until serve answers
// and the plugin has registered and listed its devices, then prints the
// status as without it.
func TestStatusWaitsForServeAndPlugin(t *testing.T) {
	dir := shortTempDir(t)
	ctl := filepath.Join(dir, "ctl.sock")
	sockDir := filepath.Join(dir, "dp")
	status := startProc(t, nil, "status", "--control-socket", ctl, "--wait-for", gpu, "--timeout", "30s", "-v", "4")
	// It has tried, and found nothing, before serve starts.
	require.True(t, eventually(10*time.Second, status.exited, func() bool {
		return strings.Contains(status.log.String(), "cannot reach devmgr serve") || strings.Contains(status.log.String(), `"Calling devmgr serve"`)
	}), "status did not try: %s", status.log.String())
	startServe(t, ctl, "--socket-dir", sockDir, "--numa-nodes", "0,1")
	select {
	case <-status.exited:
		require.FailNow(t, "status returned before the plugin came", status.log.String())
	default:
	}
	startPlugin(t, sockDir, gpus(3))
	select {
	case <-status.exited:
	case <-time.After(20 * time.Second):
		require.FailNow(t, "status did not return once the plugin was there", status.log.String())
	}
	require.NoError(t, status.waitErr, status.log.String())
	assert.Regexp(t, `(?m)^example\.com/gpu +3 +3 +0 +3 *$`, status.log.String())
	assert.Regexp(t, `(?m)^example\.com/gpu +\S+/example\.com-gpu\.sock +no +yes +running$`, status.log.String())
}

// status --wait-for gives up after --timeout, exit code 4, naming what it
// waited for; a status already there is printed at once, --json as one
// document.
func TestStatusWaitForTimesOut(t *testing.T) {
	h := newControlHarness(t, gpus(2))
	missing := filepath.Join(h.dir, "missing.sock")

	res := devmgr(t, "", "status", "--control-socket", h.sock, "--wait-for", gpu+",example.com/nic", "--timeout", "1s")
	assert.Equal(t, exitNotFound, res.code)
	assert.Equal(t, "devmgr: no device plugin of example.com/nic registered and listed devices within 1s (--timeout)\n", res.stderr)
	assert.Empty(t, res.stdout)

	res = devmgr(t, "", "status", "--control-socket", missing, "--wait-for", gpu, "--timeout", "200ms")
	assert.Equal(t, exitNotFound, res.code)
	assert.Regexp(t, `^devmgr: waited 200ms \(--timeout\): (cannot reach devmgr serve on `+regexp.QuoteMeta(missing)+`|no answer from devmgr serve)`, res.stderr)

	res = devmgr(t, "", "status", "--control-socket", h.sock, "--wait-for", gpu, "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	var st statusResponse
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &st), "one JSON document: %s", res.stdout)
	assert.Equal(t, 2, st.resource(gpu).Allocatable)
}
