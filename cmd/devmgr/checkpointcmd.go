package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
)

// Checkpoint formats, as reported by inspect and verify.
const (
	checkpointFormatCurrent = "current"  // DeviceIDs per NUMA node (Kubernetes 1.20 and later)
	checkpointFormatLegacy  = "pre-1.20" // DeviceIDs as a plain list
)

func newCheckpointCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "Read and check a kubelet_internal_checkpoint file",
		Long: `Read and check the device manager's checkpoint, kubelet_internal_checkpoint,
as written by the kubelet (any version, pre-1.20 files included) or by devmgr.

FILE is the checkpoint file, whatever its name, or a directory holding
kubelet_internal_checkpoint (such as /var/lib/kubelet/device-plugins).`,
		Example: `  devmgr checkpoint verify /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint
  devmgr checkpoint inspect /var/lib/kubelet/device-plugins
  devmgr checkpoint inspect --json ./saved-checkpoint | jq .entries`,
		Args: cobra.NoArgs, // an unknown subcommand is an error
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newCheckpointInspectCmd(), newCheckpointVerifyCmd())
	return cmd
}

func newCheckpointInspectCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect FILE",
		Short: "Show a checkpoint's allocations, registered devices, format and checksum",
		Long: `Show what a kubelet_internal_checkpoint holds: each allocation (pod UID,
container, resource, devices per NUMA node and the plugin's decoded Allocate
response), the registered devices of each resource, the format found
(current, or pre-1.20 where device IDs were a plain list) and whether the
checksum verifies.

A file whose checksum does not verify is still shown, with the checksum
error; the command then exits 0, since the content was read (use "verify" to
check). A file that is not there makes it exit 4, one that does not decode
exit 3, one that cannot be read exit 1.

--json prints one document:
  {"format","checksumOK","error","entries":[{"podUID","containerName",
   "resourceName","devicesPerNUMA":{"0":["id"]},"allocResp":{...}}],
   "registeredDevices":{"<resource>":["id"]}}
where allocResp is the v1beta1.ContainerAllocateResponse in protobuf JSON, and
NUMA node "-1" means "no topology" (every device of a pre-1.20 file).`,
		Example: `  devmgr checkpoint inspect /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint
  devmgr checkpoint inspect --json /var/lib/kubelet/device-plugins | jq '.entries[].devicesPerNUMA'`,
		Args: oneArg("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			rep, err := readCheckpointFile(args[0])
			if asJSON {
				b, merr := json.MarshalIndent(rep, "", "  ")
				if merr != nil {
					return merr
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
			} else if rep.decoded {
				writeCheckpointText(cmd.OutOrStdout(), rep)
			}
			if rep.decoded {
				return nil // shown, checksum error included
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON document")
	return cmd
}

func newCheckpointVerifyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "verify FILE",
		Short: "Check that a checkpoint decodes and its checksum verifies",
		Long: `Check a kubelet_internal_checkpoint the way the kubelet does when it starts:
the file must decode and its checksum must match its content.

Prints "ok" with the format and exits 0 when the checkpoint is valid.
Otherwise it prints the reason on stderr and exits 3 when the file is corrupt
("checkpoint is corrupted: expected X, actual Y", where X is the checksum
stored in the file and Y the checksum of its content, or the JSON decoding
error), 4 when there is no file ("checkpoint is not found"), 1 when it cannot
be read.`,
		Example: `  devmgr checkpoint verify /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint
  devmgr checkpoint verify ./backup/kubelet_internal_checkpoint && cp ./backup/kubelet_internal_checkpoint /var/lib/kubelet/device-plugins/`,
		Args: oneArg("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			rep, err := readCheckpointFile(args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "ok: %s (format %s, checksum %d, entries %d)\n",
				rep.path, rep.Format, rep.checksum, len(rep.Entries))
			return nil
		},
	}
}

// checkpointReport is what inspect shows; its JSON form is the --json
// document.
type checkpointReport struct {
	Format            string              `json:"format"` // checkpointFormatCurrent, checkpointFormatLegacy, or "" when undecodable
	ChecksumOK        bool                `json:"checksumOK"`
	Error             string              `json:"error"` // why the checkpoint is not valid; "" when it is
	Entries           []checkpointEntry   `json:"entries"`
	RegisteredDevices map[string][]string `json:"registeredDevices"`

	path     string // the file read
	decoded  bool   // the file was read and decoded
	checksum uint64 // the checksum stored in the file
	actual   uint64 // the checksum of the content
}

// checkpointEntry is one allocation record.
type checkpointEntry struct {
	PodUID         string              `json:"podUID"`
	ContainerName  string              `json:"containerName"`
	ResourceName   string              `json:"resourceName"`
	DevicesPerNUMA map[string][]string `json:"devicesPerNUMA"`
	// AllocResp is the decoded v1beta1.ContainerAllocateResponse in
	// protobuf JSON; null when the bytes do not decode.
	AllocResp      json.RawMessage `json:"allocResp"`
	AllocRespError string          `json:"allocRespError,omitempty"`

	resp *pluginapi.ContainerAllocateResponse // decoded; nil when AllocRespError
}

// readCheckpointFile reads and decodes the checkpoint at path (a file of any
// name, or a directory holding kubelet_internal_checkpoint) and verifies its
// checksum. The report is never nil: it holds what could be read. The error,
// prefixed with the path, says why the file is not a valid checkpoint:
// checkpoint.ErrNotFound, a *checkpoint.DecodeError, a *checkpoint.CorruptError
// or a read error; it carries the exit code of its class.
func readCheckpointFile(path string) (*checkpointReport, error) {
	rep := &checkpointReport{path: path, Entries: []checkpointEntry{}, RegisteredDevices: map[string][]string{}}
	fail := func(err error) (*checkpointReport, error) {
		rep.Error = err.Error()
		code := exitFailure
		var de *checkpoint.DecodeError
		var ce *checkpoint.CorruptError
		switch {
		case errors.Is(err, checkpoint.ErrNotFound):
			code = exitNotFound
		case errors.As(err, &de), errors.As(err, &ce):
			code = exitRefused
		}
		return rep, &exitError{code: code, err: fmt.Errorf("%s: %w", rep.path, err)}
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		rep.path = filepath.Join(path, checkpoint.DeviceManagerKey)
	}
	blob, err := os.ReadFile(rep.path)
	if errors.Is(err, fs.ErrNotExist) {
		return fail(checkpoint.ErrNotFound)
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is added once, below
		}
		return fail(err)
	}
	var data checkpoint.Data
	if err := data.UnmarshalCheckpoint(blob); err != nil {
		return fail(err)
	}
	rep.decoded = true
	rep.Format = checkpointFormatCurrent
	if data.Legacy() {
		rep.Format = checkpointFormatLegacy
	}
	rep.checksum = data.Checksum()
	entries, registered := data.GetData()
	for _, e := range entries {
		rep.Entries = append(rep.Entries, newCheckpointEntry(e))
	}
	for res, ids := range registered {
		if ids == nil {
			ids = []string{}
		}
		rep.RegisteredDevices[res] = ids
	}

	rep.actual = rep.checksum
	if err := data.VerifyChecksum(); err != nil {
		var ce *checkpoint.CorruptError
		if errors.As(err, &ce) {
			rep.actual = ce.ActualCS
			// The kubelet's message, with both checksums: the one stored in
			// the file (expected) and the one of the content (actual).
			err = fmt.Errorf("%w: expected %d, actual %d", err, ce.ExpectedCS, ce.ActualCS)
		}
		return fail(err)
	}
	rep.ChecksumOK = true
	return rep, nil
}

func newCheckpointEntry(e checkpoint.PodDevicesEntry) checkpointEntry {
	out := checkpointEntry{
		PodUID:         e.PodUID,
		ContainerName:  e.ContainerName,
		ResourceName:   e.ResourceName,
		DevicesPerNUMA: map[string][]string{},
		AllocResp:      json.RawMessage("null"),
	}
	for numa, ids := range e.DeviceIDs {
		if ids == nil {
			ids = []string{}
		}
		out.DevicesPerNUMA[strconv.FormatInt(numa, 10)] = ids
	}
	resp := &pluginapi.ContainerAllocateResponse{}
	if err := proto.Unmarshal(e.AllocResp, resp); err != nil {
		out.AllocRespError = "decode Allocate response: " + err.Error()
		return out
	}
	b, err := protojson.Marshal(resp)
	if err != nil {
		out.AllocRespError = "encode Allocate response: " + err.Error()
		return out
	}
	// protojson varies its spacing on purpose; compact it to stable bytes.
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		out.AllocRespError = "encode Allocate response: " + err.Error()
		return out
	}
	out.AllocResp = buf.Bytes()
	out.resp = resp
	return out
}

// checkpointNUMAKeys returns the NUMA node keys of an entry in numeric order.
func checkpointNUMAKeys(m map[string][]string) []string {
	return slices.SortedFunc(maps.Keys(m), func(a, b string) int {
		x, _ := strconv.ParseInt(a, 10, 64)
		y, _ := strconv.ParseInt(b, 10, 64)
		return cmp.Compare(x, y)
	})
}
