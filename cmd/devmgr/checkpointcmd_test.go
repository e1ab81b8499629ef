package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
)

// fixture returns the path of a kubelet-written checkpoint in testdata.
func fixture(name string) string {
	return filepath.Join("..", "..", "testdata", "kubelet-checkpoints", name, checkpoint.DeviceManagerKey)
}

func TestCheckpointVerify(t *testing.T) {
	// A valid checkpoint under another name, and a directory holding one.
	renamed := filepath.Join(t.TempDir(), "saved.json")
	blob, err := os.ReadFile(fixture("sample"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(renamed, blob, 0o600))
	missing := filepath.Join(t.TempDir(), "nothing-here")

	for _, tc := range []struct {
		name     string
		path     string
		exitCode int
		stdout   string // prefix
		stderr   string // exact
	}{
		{name: "sample", path: fixture("sample"), stdout: "ok: " + fixture("sample") + " (format current, checksum 648430460, entries 1)\n"},
		{name: "empty", path: fixture("empty"), stdout: "ok: " + fixture("empty") + " (format current, checksum 3467439661, entries 0)\n"},
		{name: "reformatted by hand, same content", path: fixture("reformatted"), stdout: "ok: " + fixture("reformatted") + " (format current, checksum 648430460, entries 1)\n"},
		{name: "pre-1.20", path: fixture("legacy-v1-valid"), stdout: "ok: " + fixture("legacy-v1-valid") + " (format pre-1.20, checksum 4073806608, entries 1)\n"},
		{name: "any file name", path: renamed, stdout: "ok: " + renamed + " (format current"},
		{name: "a directory", path: filepath.Dir(fixture("sample")), stdout: "ok: " + fixture("sample") + " (format current"},
		{
			name: "corrupt", path: fixture("corrupt"), exitCode: 3,
			stderr: "devmgr: " + fixture("corrupt") + ": checkpoint is corrupted: expected 648430461, actual 648430460\n",
		},
		{
			name: "pre-1.20 with a bad checksum", path: fixture("legacy-v1"), exitCode: 3,
			stderr: "devmgr: " + fixture("legacy-v1") + ": checkpoint is corrupted: expected 1, actual 4073806608\n",
		},
		{
			name: "bad JSON", path: fixture("badjson"), exitCode: 3,
			stderr: "devmgr: " + fixture("badjson") + ": decode checkpoint: unexpected end of JSON input\n",
		},
		{
			name: "missing", path: missing, exitCode: 4,
			stderr: "devmgr: " + missing + ": checkpoint is not found\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runDevmgrBinary(t, nil, "checkpoint", "verify", tc.path)
			assert.Equal(t, tc.exitCode, res.exitCode, res.stderr)
			if tc.exitCode == 0 {
				assert.True(t, strings.HasPrefix(res.stdout, tc.stdout), "stdout %q, want prefix %q", res.stdout, tc.stdout)
				assert.Empty(t, res.stderr)
				return
			}
			assert.Empty(t, res.stdout)
			assert.Equal(t, tc.stderr, res.stderr)
		})
	}
}

func TestCheckpointCommandArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{args: []string{"checkpoint", "verify"}, want: "devmgr: missing FILE: usage: devmgr checkpoint verify FILE [flags]\n"},
		{args: []string{"checkpoint", "inspect", "a", "b"}, want: "devmgr: devmgr checkpoint inspect takes one FILE, not 2 arguments ([\"a\" \"b\"])\n"},
		{args: []string{"checkpoint", "check", "a"}, want: `devmgr: unknown command "check" for "devmgr checkpoint"` + "\n"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			res := runDevmgrBinary(t, nil, tc.args...)
			assert.Equal(t, 2, res.exitCode, "a usage error")
			assert.Equal(t, tc.want, res.stderr)
		})
	}
}

func TestCheckpointInspectText(t *testing.T) {
	for _, tc := range []struct {
		name     string
		exitCode int
		want     string
	}{
		{name: "sample", want: `File:      ` + fixture("sample") + `
Format:    current (device IDs per NUMA node, Kubernetes 1.20 and later)
Checksum:  648430460 (verified)

Allocations:
POD UID    CONTAINER  RESOURCE         DEVICES BY NUMA NODE  ALLOCATE RESPONSE
pod-uid-1  ctr        example.com/dev  0: dev-0 dev-1        env A=1

Registered devices:
RESOURCE         DEVICES
example.com/dev  dev-0 dev-1 dev-2
`},
		{name: "legacy-v1-valid", want: `File:      ` + fixture("legacy-v1-valid") + `
Format:    pre-1.20 (device IDs without NUMA nodes; kubelets since 1.20 cannot read it)
Checksum:  4073806608 (verified)

Allocations:
POD UID    CONTAINER  RESOURCE         DEVICES BY NUMA NODE  ALLOCATE RESPONSE
pod-uid-1  ctr        example.com/dev  no NUMA: dev-0 dev-1  env A=1

Registered devices:
RESOURCE         DEVICES
example.com/dev  dev-0 dev-1 dev-2
`},
		// A corrupt file is shown too, with the checksum error.
		{name: "corrupt", want: `File:      ` + fixture("corrupt") + `
Format:    current (device IDs per NUMA node, Kubernetes 1.20 and later)
Checksum:  648430461 stored, 648430460 computed: MISMATCH
Error:     checkpoint is corrupted: expected 648430461, actual 648430460

Allocations:
POD UID    CONTAINER  RESOURCE         DEVICES BY NUMA NODE  ALLOCATE RESPONSE
pod-uid-1  ctr        example.com/dev  0: dev-0 dev-1        env A=1

Registered devices:
RESOURCE         DEVICES
example.com/dev  dev-0 dev-1 dev-2
`},
		{name: "empty", want: `File:      ` + fixture("empty") + `
Format:    current (device IDs per NUMA node, Kubernetes 1.20 and later)
Checksum:  3467439661 (verified)

Allocations:
(none)

Registered devices:
(none)
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runDevmgrBinary(t, nil, "checkpoint", "inspect", fixture(tc.name))
			assert.Equal(t, tc.exitCode, res.exitCode, res.stderr)
			assert.Equal(t, tc.want, res.stdout)
			assert.Empty(t, res.stderr)
		})
	}
}

func TestCheckpointInspectJSON(t *testing.T) {
	for _, tc := range []struct {
		name     string
		exitCode int
		stderr   string
		want     string
	}{
		{name: "sample", want: `{
			"format": "current", "checksumOK": true, "error": "",
			"entries": [{"podUID": "pod-uid-1", "containerName": "ctr", "resourceName": "example.com/dev",
				"devicesPerNUMA": {"0": ["dev-0", "dev-1"]}, "allocResp": {"envs": {"A": "1"}}}],
			"registeredDevices": {"example.com/dev": ["dev-0", "dev-1", "dev-2"]}}`},
		{name: "legacy-v1-valid", want: `{
			"format": "pre-1.20", "checksumOK": true, "error": "",
			"entries": [{"podUID": "pod-uid-1", "containerName": "ctr", "resourceName": "example.com/dev",
				"devicesPerNUMA": {"-1": ["dev-0", "dev-1"]}, "allocResp": {"envs": {"A": "1"}}}],
			"registeredDevices": {"example.com/dev": ["dev-0", "dev-1", "dev-2"]}}`},
		{name: "corrupt", want: `{
			"format": "current", "checksumOK": false,
			"error": "checkpoint is corrupted: expected 648430461, actual 648430460",
			"entries": [{"podUID": "pod-uid-1", "containerName": "ctr", "resourceName": "example.com/dev",
				"devicesPerNUMA": {"0": ["dev-0", "dev-1"]}, "allocResp": {"envs": {"A": "1"}}}],
			"registeredDevices": {"example.com/dev": ["dev-0", "dev-1", "dev-2"]}}`},
		{name: "empty", want: `{"format": "current", "checksumOK": true, "error": "", "entries": [], "registeredDevices": {}}`},
		{
			name: "badjson", exitCode: 3,
			stderr: "devmgr: " + fixture("badjson") + ": decode checkpoint: unexpected end of JSON input\n",
			want:   `{"format": "", "checksumOK": false, "error": "decode checkpoint: unexpected end of JSON input", "entries": [], "registeredDevices": {}}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runDevmgrBinary(t, nil, "checkpoint", "inspect", "--json", fixture(tc.name))
			assert.Equal(t, tc.exitCode, res.exitCode, res.stderr)
			assert.JSONEq(t, tc.want, res.stdout)
			assert.Equal(t, tc.stderr, res.stderr)
		})
	}
}

func TestReadCheckpointFileErrors(t *testing.T) {
	_, err := readCheckpointFile(filepath.Join(t.TempDir(), "missing"))
	assert.ErrorIs(t, err, checkpoint.ErrNotFound)

	rep, err := readCheckpointFile(fixture("corrupt"))
	var ce *checkpoint.CorruptError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, checkpoint.CorruptError{ActualCS: 648430460, ExpectedCS: 648430461}, *ce)
	assert.True(t, rep.decoded)
	assert.False(t, rep.ChecksumOK)

	_, err = readCheckpointFile(fixture("badjson"))
	var de *checkpoint.DecodeError
	assert.ErrorAs(t, err, &de)

	_, err = readCheckpointFile(t.TempDir()) // a directory without a checkpoint
	assert.ErrorIs(t, err, checkpoint.ErrNotFound)

	// A read error other than "not found" (this one happens as root too):
	// the path goes through a regular file.
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	unreadable := filepath.Join(file, "cp")
	_, err = readCheckpointFile(unreadable)
	require.Error(t, err)
	assert.NotErrorIs(t, err, checkpoint.ErrNotFound)
	assert.Contains(t, err.Error(), "not a directory")
}

// An Allocate response that is not a ContainerAllocateResponse is reported on
// its entry; the rest of the checkpoint is still shown.
func TestCheckpointEntryWithBadAllocResp(t *testing.T) {
	e := newCheckpointEntry(checkpoint.PodDevicesEntry{
		PodUID: "u", ContainerName: "c", ResourceName: "r",
		DeviceIDs: checkpoint.DevicesPerNUMA{1: {"b"}, -1: {"a"}, 10: nil},
		AllocResp: []byte{0xff, 0xff},
	})
	assert.Equal(t, "null", string(e.AllocResp))
	assert.Contains(t, e.AllocRespError, "decode Allocate response: ")
	assert.Equal(t, map[string][]string{"-1": {"a"}, "1": {"b"}, "10": {}}, e.DevicesPerNUMA)
	assert.Equal(t, []string{"-1", "1", "10"}, checkpointNUMAKeys(e.DevicesPerNUMA))

	// Every field of a response is described.
	resp, err := proto.Marshal(&pluginapi.ContainerAllocateResponse{
		Envs:        map[string]string{"B": "2", "A": "1"},
		Mounts:      []*pluginapi.Mount{{ContainerPath: "/c", HostPath: "/h", ReadOnly: true}, {ContainerPath: "/c2", HostPath: "/h2"}},
		Devices:     []*pluginapi.DeviceSpec{{ContainerPath: "/dev/c", HostPath: "/dev/h", Permissions: "rw"}},
		Annotations: map[string]string{"k": "v"},
		CdiDevices:  []*pluginapi.CDIDevice{{Name: "vendor.com/gpu=0"}},
	})
	require.NoError(t, err)
	e = newCheckpointEntry(checkpoint.PodDevicesEntry{AllocResp: resp})
	assert.Empty(t, e.AllocRespError)
	assert.JSONEq(t, `{"envs":{"A":"1","B":"2"},"mounts":[{"containerPath":"/c","hostPath":"/h","readOnly":true},{"containerPath":"/c2","hostPath":"/h2"}],
		"devices":[{"containerPath":"/dev/c","hostPath":"/dev/h","permissions":"rw"}],"annotations":{"k":"v"},"cdiDevices":[{"name":"vendor.com/gpu=0"}]}`,
		string(e.AllocResp))
	assert.Equal(t, []string{
		"env A=1", "env B=2",
		"device /dev/h -> /dev/c (rw)",
		"mount /h -> /c (ro)", "mount /h2 -> /c2 (rw)",
		"annotation k=v",
		"cdi vendor.com/gpu=0",
	}, allocRespLines(e.resp))
	assert.Equal(t, []string{"(empty)"}, allocRespLines(&pluginapi.ContainerAllocateResponse{}))
}
