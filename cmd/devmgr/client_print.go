package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// The readable output of the client commands: tables, one section per kind
// of thing, an empty section said in words.

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
}

// row writes one tab-separated table row.
func row(tw io.Writer, cells ...string) {
	_, _ = fmt.Fprintln(tw, strings.Join(cells, "\t"))
}

func printStatus(w io.Writer, st statusResponse) error {
	tw := newTable(w)
	numa := make([]string, 0, len(st.Manager.NUMANodes))
	for _, n := range st.Manager.NUMANodes {
		numa = append(numa, strconv.Itoa(n))
	}
	_, _ = fmt.Fprintf(tw, "Socket directory: %s\nCheckpoint directory: %s\nNUMA nodes: %s\n\n",
		st.Manager.SocketDir, st.Manager.CheckpointDir, orDash(strings.Join(numa, ",")))
	if len(st.Resources) == 0 {
		_, _ = fmt.Fprintln(tw, "No resources: no device plugin has registered.")
		return tw.Flush()
	}
	row(tw, "RESOURCE", "CAPACITY", "ALLOCATABLE", "ALLOCATED", "FREE", "NOTE")
	for _, r := range st.Resources {
		note := ""
		if r.RestoredFromCheckpoint {
			note = "restored from checkpoint; waiting for its plugin"
		}
		row(tw, r.Name, strconv.Itoa(r.Capacity), strconv.Itoa(r.Allocatable), strconv.Itoa(r.Allocated),
			strconv.Itoa(r.Free), note)
	}
	_, _ = fmt.Fprintln(tw)
	row(tw, "RESOURCE", "DEVICE", "HEALTH", "NUMA", "ALLOCATED")
	for _, r := range st.Resources {
		for _, d := range r.Devices {
			nodes := make([]string, 0, len(d.NUMA))
			for _, n := range d.NUMA {
				nodes = append(nodes, strconv.FormatInt(n, 10))
			}
			row(tw, r.Name, d.ID, d.Health, orDash(strings.Join(nodes, ",")), yesNo(d.Allocated))
		}
	}
	_, _ = fmt.Fprintln(tw)
	if len(st.Endpoints) == 0 {
		_, _ = fmt.Fprintln(tw, "No plugin endpoints.")
		return tw.Flush()
	}
	row(tw, "RESOURCE", "ENDPOINT", "PRESTART", "PREFERRED-ALLOCATION", "STATE")
	for _, e := range st.Endpoints {
		state := "running"
		if e.Stopped {
			state = "stopped"
		}
		row(tw, e.Resource, orDash(e.Socket), yesNo(e.Options.PreStartRequired),
			yesNo(e.Options.GetPreferredAllocationAvailable), state)
	}
	return tw.Flush()
}

func printPods(w io.Writer, pods podsResponse) error {
	tw := newTable(w)
	if len(pods.Pods) == 0 {
		_, _ = fmt.Fprintln(tw, "No pods admitted.")
		return tw.Flush()
	}
	row(tw, "UID", "POD", "CONTAINER", "RESOURCE", "DEVICES")
	for _, p := range pods.Pods {
		for _, c := range p.Containers {
			containerRows(tw, []string{p.UID, p.Namespace + "/" + p.Name}, c)
		}
	}
	return tw.Flush()
}

// containerRows writes one row per resource the container holds, or one row
// of dashes when it holds none, each starting with lead.
func containerRows(tw io.Writer, lead []string, c containerJSON) {
	if len(c.Devices) == 0 {
		row(tw, append(lead, c.Name, "-", "-")...)
		return
	}
	for _, res := range sortedKeys(c.Devices) {
		row(tw, append(lead, c.Name, res, orDash(strings.Join(c.Devices[res], ",")))...)
	}
}

func printAdmission(w io.Writer, a admissionResponse) error {
	tw := newTable(w)
	_, _ = fmt.Fprintf(tw, "Pod %s/%s admitted (uid %s).\n\n", a.Pod.Namespace, a.Pod.Name, a.Pod.UID)
	row(tw, "CONTAINER", "RESOURCE", "DEVICES")
	for _, c := range a.Containers {
		containerRows(tw, nil, c)
	}
	var opts [][]string
	for _, c := range a.Containers {
		o := c.RunOptions
		if o == nil {
			continue
		}
		for _, e := range o.Envs {
			opts = append(opts, []string{c.Name, "env", e.Name + "=" + e.Value})
		}
		for _, m := range o.Mounts {
			mode := "rw"
			if m.ReadOnly {
				mode = "ro"
			}
			opts = append(opts, []string{c.Name, "mount", fmt.Sprintf("%s -> %s (%s)", m.HostPath, m.ContainerPath, mode)})
		}
		for _, d := range o.Devices {
			opts = append(opts, []string{c.Name, "device", fmt.Sprintf("%s -> %s (%s)", d.PathOnHost, d.PathInContainer, d.Permissions)})
		}
		for _, an := range o.Annotations {
			opts = append(opts, []string{c.Name, "annotation", an.Name + "=" + an.Value})
		}
		for _, cdi := range o.CDIDevices {
			opts = append(opts, []string{c.Name, "cdi", cdi.Name})
		}
	}
	if len(opts) > 0 {
		_, _ = fmt.Fprintln(tw)
		row(tw, "CONTAINER", "RUNTIME", "VALUE")
		for _, o := range opts {
			row(tw, o...)
		}
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
