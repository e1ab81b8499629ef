package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// emptyTempDir returns a fresh directory to use as $TMPDIR, and checks at the
// end of the test that the command left nothing in it.
// It is short (t.TempDir's name grows with the test's): unix socket paths
// must fit in 108 bytes.
func emptyTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dmt")
	require.NoError(t, err)
	t.Cleanup(func() {
		entries, err := os.ReadDir(dir)
		if assert.NoError(t, err) {
			assert.Empty(t, entries, "left in $TMPDIR")
		}
		assert.NoError(t, os.RemoveAll(dir))
	})
	return dir
}

func TestDemoCommandShowsEveryStep(t *testing.T) {
	tmp := emptyTempDir(t)
	res := runDevmgrBinary(t, []string{"TMPDIR=" + tmp}, "demo")
	require.Equal(t, 0, res.exitCode, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	// The demo ran to its end (runDevmgrBinary fails the test if the binary
	// is still running after a minute): its last line is the cleanup.
	assert.True(t, strings.HasSuffix(res.stdout, "\nCleanup:    managers and plugins stopped, directory removed\n"),
		"the demo's output does not end with its cleanup line")
	assert.Empty(t, res.stderr, "the demo is quiet without -v")

	for i, step := range demoSteps {
		assert.Contains(t, res.stdout, fmt.Sprintf("== %d. %s\n", i+1, step))
	}
	for _, want := range []string{
		"Directory:   " + tmp + "/dmdemo",
		"example.com/gpu  example.com-gpu.sock  4        no         yes: pack on one NUMA node  yes",
		"example.com/nic  example.com-nic.sock  8        yes        no                          no",
		"example.com/gpu  4         4            0          4     gpu-0 gpu-2              gpu-1 gpu-3",
		"training   warmup     init     example.com/gpu  gpu-0 (0)",
		"training   net-agent  sidecar  example.com/nic  nic-0 (0)",
		"training   trainer    app      example.com/gpu  gpu-0 (0), gpu-2 (0)",
		`Refused batch (3-batch.yaml): container "worker": requested number of devices unavailable for example.com/gpu. Requested: 2, Available: 1`,
		"training/trainer reuses gpu-0 of init container warmup",
		"training/trainer got gpu-0 gpu-2 all on NUMA node 0",
		"example.com/gpu=gpu-2",
		"example.com/nic asks for PreStartContainer: the manager called it 3 times",
		"The example.com/gpu plugin reports gpu-2 Unhealthy.",
		"Updates() names the pods to re-sync: training",
		"training  trainer    example.com/gpu  gpu-2   Unhealthy",
		"example.com/gpu now: capacity 4, allocatable 3.",
		"Started a new manager on the same directory: it removed the plugins' stale sockets.",
		"Before any plugin is back it knows 6 of 6 allocations, from the checkpoint alone",
		"checkpoint (plugin not back yet)",
		"The plugins restarted and registered again.",
		"training   trainer    example.com/gpu  gpu-0 gpu-2  gpu-0 gpu-2  yes",
		"Run options after the restart are the same as at admission: yes.",
		"Pods:       2 admitted (training, inference), 1 refused (batch)",
		"Restart:    6 of 6 allocations restored from the checkpoint; run options unchanged: yes",
	} {
		assert.Contains(t, res.stdout, want)
	}
	for i, line := range strings.Split(res.stdout, "\n") {
		assert.Equal(t, strings.TrimRight(line, " "), line, "line %d has trailing blanks", i+1)
	}
}

func TestDemoCommandJSON(t *testing.T) {
	tmp := emptyTempDir(t)
	res := runDevmgrBinary(t, []string{"TMPDIR=" + tmp}, "demo", "--json")
	require.Equal(t, 0, res.exitCode, "stderr:\n%s", res.stderr)
	assert.Empty(t, res.stderr)

	// Exactly one JSON document.
	dec := json.NewDecoder(strings.NewReader(res.stdout))
	var doc map[string]json.RawMessage
	require.NoError(t, dec.Decode(&doc))
	var extra json.RawMessage
	assert.ErrorIs(t, dec.Decode(&extra), io.EOF, "more than one JSON document")
	for _, key := range []string{"dir", "steps", "numaNodes", "plugins", "capacity", "pods", "health", "restart", "summary"} {
		assert.Contains(t, doc, key)
	}

	var rep demoReport
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &rep))
	assert.Equal(t, demoSteps, rep.Steps)
	assert.True(t, strings.HasPrefix(rep.Dir, tmp), rep.Dir)
	assert.Equal(t, demoSummary{
		Admitted:        []string{"training", "inference"},
		Refused:         []string{"batch"},
		Allocated:       []demoAllocCount{{demoGPU, 3, 4}, {demoNIC, 4, 8}},
		UnhealthyDevice: "gpu-2",
		NotifiedPods:    []string{"training"},
		Restored:        6,
		Allocations:     6,
		RunOptionsSame:  true,
		CleanedUp:       true,
	}, rep.Summary)
	require.Len(t, rep.Pods, 3)
	assert.Equal(t, "7b0e5a52-0000-4000-8000-000000000001", rep.Pods[0].UID)
	require.NotNil(t, rep.Restart)
	assert.True(t, rep.Restart.AllSame)
	assert.True(t, rep.Restart.Checkpoint.ChecksumOK)
	assert.Equal(t, 6, rep.Restart.Checkpoint.Entries)
}

// -v N is klog's verbosity, as for every command: 2 shows the manager's
// registrations, 3 its allocation decisions too; -vv is short for -v 3.
func TestDemoCommandVerboseLogsToStderr(t *testing.T) {
	tmp := emptyTempDir(t)
	for _, tc := range []struct {
		args        []string
		allocations bool
	}{{[]string{"-v", "2"}, false}, {[]string{"-v", "3"}, true}, {[]string{"-vv"}, true}} {
		res := runDevmgrBinary(t, []string{"TMPDIR=" + tmp}, append([]string{"demo"}, tc.args...)...)
		require.Equal(t, 0, res.exitCode, "stderr:\n%s", res.stderr)
		assert.Contains(t, res.stderr, `"Registered device plugin"`, tc.args)
		if tc.allocations {
			assert.Contains(t, res.stderr, `"Allocating devices"`, tc.args)
		} else {
			assert.NotContains(t, res.stderr, `"Allocating devices"`, tc.args)
		}
		assert.Contains(t, res.stdout, "== 7. Summary")
		assert.NotContains(t, res.stdout, "Device manager started", "logs go to stderr only")
	}
	res := runDevmgrBinary(t, []string{"TMPDIR=" + tmp}, "demo")
	require.Equal(t, 0, res.exitCode, "stderr:\n%s", res.stderr)
	assert.Empty(t, res.stderr, "no logs without -v")
}

func TestDemoCommandFailsCleanlyWhenItCannotStart(t *testing.T) {
	// A $TMPDIR so long that kubelet.sock cannot fit in a unix socket path.
	tmp := emptyTempDir(t)
	long := tmp + "/" + strings.Repeat("d", 100)
	require.NoError(t, os.Mkdir(long, 0o700))
	res := runDevmgrBinary(t, []string{"TMPDIR=" + long}, "demo")
	assert.Equal(t, 1, res.exitCode)
	assert.Contains(t, res.stderr, "devmgr: TMPDIR "+long+" is too long for the demo's unix sockets")
	assert.Contains(t, res.stderr, "TMPDIR=/tmp devmgr demo", "the way out")
	entries, err := os.ReadDir(long)
	require.NoError(t, err)
	assert.Empty(t, entries)
	require.NoError(t, os.Remove(long))
}

// Every command of this file set has help with examples.
func TestHelpHasExamples(t *testing.T) {
	for _, args := range [][]string{
		{"demo"},
		{"checkpoint"},
		{"checkpoint", "inspect"},
		{"checkpoint", "verify"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			res := runDevmgrBinary(t, nil, append(args, "--help")...)
			require.Equal(t, 0, res.exitCode, res.stderr)
			assert.Contains(t, res.stdout, "Usage:")
			assert.Contains(t, res.stdout, "Examples:")
			assert.Contains(t, res.stdout, "devmgr "+strings.Join(args, " "))
		})
	}
}

// The help texts are also checked in process, for the race detector and for
// coverage.
func TestCommandsHaveExamples(t *testing.T) {
	root := newRootCmd()
	for _, path := range [][]string{{"demo"}, {"checkpoint"}, {"checkpoint", "inspect"}, {"checkpoint", "verify"}, {"sanity"}} {
		cmd, _, err := root.Find(path)
		require.NoError(t, err)
		assert.NotEmpty(t, cmd.Example, path)
		assert.NotEmpty(t, cmd.Short, path)
	}
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"checkpoint", "verify", "--help"})
	require.NoError(t, root.Execute())
	assert.Contains(t, out.String(), "checkpoint is corrupted: expected X")
}
