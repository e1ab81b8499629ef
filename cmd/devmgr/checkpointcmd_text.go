package main

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// writeCheckpointText prints a decoded checkpoint for people.
func writeCheckpointText(w io.Writer, rep *checkpointReport) {
	fmt.Fprintf(w, "File:      %s\n", rep.path)
	switch rep.Format {
	case checkpointFormatLegacy:
		fmt.Fprintf(w, "Format:    %s (device IDs without NUMA nodes; kubelets since 1.20 cannot read it)\n", rep.Format)
	default:
		fmt.Fprintf(w, "Format:    %s (device IDs per NUMA node, Kubernetes 1.20 and later)\n", rep.Format)
	}
	if rep.ChecksumOK {
		fmt.Fprintf(w, "Checksum:  %d (verified)\n", rep.checksum)
	} else {
		fmt.Fprintf(w, "Checksum:  %d stored, %d computed: MISMATCH\n", rep.checksum, rep.actual)
		fmt.Fprintf(w, "Error:     %s\n", rep.Error)
	}

	fmt.Fprintln(w, "\nAllocations:")
	if len(rep.Entries) == 0 {
		fmt.Fprintln(w, "(none)")
	} else {
		tw := newAlignedTable(w)
		tw.row("POD UID", "CONTAINER", "RESOURCE", "DEVICES BY NUMA NODE", "ALLOCATE RESPONSE")
		for _, e := range rep.Entries {
			var numa []string
			for _, k := range checkpointNUMAKeys(e.DevicesPerNUMA) {
				label := k
				if k == "-1" {
					label = "no NUMA"
				}
				numa = append(numa, label+": "+strings.Join(e.DevicesPerNUMA[k], " "))
			}
			resp := allocRespLines(e.resp)
			if e.AllocRespError != "" {
				resp = []string{e.AllocRespError}
			}
			tw.rows([]string{e.PodUID}, []string{e.ContainerName}, []string{e.ResourceName}, numa, resp)
		}
		tw.flush()
	}

	fmt.Fprintln(w, "\nRegistered devices:")
	if len(rep.RegisteredDevices) == 0 {
		fmt.Fprintln(w, "(none)")
	} else {
		tw := newAlignedTable(w)
		tw.row("RESOURCE", "DEVICES")
		for _, res := range slices.Sorted(maps.Keys(rep.RegisteredDevices)) {
			tw.row(res, strings.Join(rep.RegisteredDevices[res], " "))
		}
		tw.flush()
	}
}

// allocRespLines describes an Allocate response, one item a line, in a
// stable order: envs, device nodes, mounts, annotations, CDI devices.
func allocRespLines(r *pluginapi.ContainerAllocateResponse) []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(r.GetEnvs())) {
		out = append(out, fmt.Sprintf("env %s=%s", k, r.GetEnvs()[k]))
	}
	for _, d := range r.GetDevices() {
		out = append(out, fmt.Sprintf("device %s -> %s (%s)", d.GetHostPath(), d.GetContainerPath(), d.GetPermissions()))
	}
	for _, m := range r.GetMounts() {
		mode := "rw"
		if m.GetReadOnly() {
			mode = "ro"
		}
		out = append(out, fmt.Sprintf("mount %s -> %s (%s)", m.GetHostPath(), m.GetContainerPath(), mode))
	}
	for _, k := range slices.Sorted(maps.Keys(r.GetAnnotations())) {
		out = append(out, fmt.Sprintf("annotation %s=%s", k, r.GetAnnotations()[k]))
	}
	for _, c := range r.GetCdiDevices() {
		out = append(out, "cdi "+c.GetName())
	}
	if len(out) == 0 {
		out = append(out, "(empty)")
	}
	return out
}

// alignedTable prints rows of cells in aligned columns, two spaces apart,
// without trailing blanks.
type alignedTable struct {
	out io.Writer
	buf bytes.Buffer
	tw  *tabwriter.Writer
}

func newAlignedTable(w io.Writer) *alignedTable {
	t := &alignedTable{out: w}
	t.tw = tabwriter.NewWriter(&t.buf, 0, 0, 2, ' ', 0)
	return t
}

// row adds one row of cells.
func (t *alignedTable) row(cells ...string) {
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

// rows adds one logical row whose cells may hold several lines: line i of
// every cell goes on row i. An empty cell shows "-" on the first row.
func (t *alignedTable) rows(cells ...[]string) {
	n := 1
	for _, c := range cells {
		n = max(n, len(c))
	}
	for i := range n {
		row := make([]string, len(cells))
		for j, c := range cells {
			switch {
			case i < len(c):
				row[j] = c[i]
			case i == 0:
				row[j] = "-"
			}
		}
		t.row(row...)
	}
}

// flush writes the table. Writing to a buffer cannot fail, and a failed
// write to stdout has nowhere to be reported.
func (t *alignedTable) flush() {
	_ = t.tw.Flush()
	for line := range strings.Lines(t.buf.String()) {
		fmt.Fprintln(t.out, strings.TrimRight(line, " \n"))
	}
	t.buf.Reset()
}
