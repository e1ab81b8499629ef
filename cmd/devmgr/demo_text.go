package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// writeDemoText prints the demo's report as short headed steps with tables.
func writeDemoText(w io.Writer, rep *demoReport) {
	step := 0
	heading := func() {
		if step > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "== %d. %s\n", step+1, rep.Steps[step])
		step++
	}
	numa := demoNUMAIndex(rep.Capacity)

	heading() // manager
	fmt.Fprintf(w, "Directory:   %s (removed at the end)\n", rep.Dir)
	fmt.Fprintf(w, "Socket:      kubelet.sock   Checkpoint: kubelet_internal_checkpoint   NUMA nodes: %s\n", demoJoinInts(rep.NUMANodes))

	heading() // plugins, capacity
	tw := newAlignedTable(w)
	tw.row("PLUGIN", "SOCKET", "DEVICES", "PRE-START", "PREFERRED ALLOCATION", "CDI")
	for _, p := range rep.Plugins {
		pref := yesOrNo(p.GetPreferredAllocationAvailable)
		if p.PreferredAllocationPolicy != "" {
			pref += ": " + p.PreferredAllocationPolicy
		}
		tw.row(p.Resource, p.Socket, strconv.Itoa(p.Devices), yesOrNo(p.PreStartRequired), pref, yesOrNo(p.CDI))
	}
	tw.flush()
	fmt.Fprintln(w)
	writeCapacity(w, rep.Capacity, rep.NUMANodes)

	heading() // admission
	tw = newAlignedTable(w)
	tw.row("POD", "CONTAINER", "KIND", "RESOURCE", "DEVICES (NUMA NODE)")
	var refused []demoPod
	for _, p := range rep.Pods {
		if !p.Admitted {
			refused = append(refused, p)
			tw.row(p.Name, "-", "-", "-", "REFUSED (below)")
			continue
		}
		for _, c := range p.Containers {
			var res, devs []string
			for _, r := range slices.Sorted(maps.Keys(c.Devices)) {
				res = append(res, r)
				var ids []string
				for _, id := range c.Devices[r] {
					ids = append(ids, id+" ("+demoJoinNUMA(numa[r+"/"+id])+")")
				}
				devs = append(devs, strings.Join(ids, ", "))
			}
			tw.rows([]string{p.Name}, []string{c.Name}, []string{c.Kind}, res, devs)
		}
	}
	tw.flush()
	for _, p := range refused {
		fmt.Fprintf(w, "Refused %s (%s): %s\n", p.Name, p.File, p.Error)
	}
	for _, note := range admissionNotes(rep, numa) {
		fmt.Fprintln(w, note)
	}

	heading() // run options
	tw = newAlignedTable(w)
	tw.row("CONTAINER", "ENV", "CDI DEVICES", "DEVICE NODES", "MOUNTS", "ANNOTATIONS")
	for _, p := range rep.Pods {
		for _, c := range p.Containers {
			o := c.RunOptions
			if o == nil {
				tw.row(p.Name+"/"+c.Name, "-", "-", "0", "0", "0")
				continue
			}
			var envs []string
			for _, e := range o.Envs {
				envs = append(envs, e.Name+"="+e.Value)
			}
			tw.rows([]string{p.Name + "/" + c.Name}, envs, o.CDIDevices,
				[]string{strconv.Itoa(len(o.Devices))}, []string{strconv.Itoa(len(o.Mounts))},
				[]string{strconv.Itoa(len(o.Annotations))})
		}
	}
	tw.flush()
	for _, p := range rep.Plugins {
		if p.PreStartRequired {
			fmt.Fprintf(w, "%s asks for PreStartContainer: the manager called it %d times, before returning the options of each container holding its devices.\n",
				p.Resource, p.PreStartCalls)
		}
	}

	heading() // health
	if h := rep.Health; h != nil {
		fmt.Fprintf(w, "The %s plugin reports %s Unhealthy.\n", h.Resource, h.Device)
		fmt.Fprintf(w, "Updates() names the pods to re-sync: %s\n", strings.Join(h.NotifiedPods, ", "))
		tw = newAlignedTable(w)
		tw.row("POD", "CONTAINER", "RESOURCE", "DEVICE", "HEALTH")
		for _, d := range h.Containers {
			tw.row(d.Pod, d.Container, d.Resource, d.Device, d.Health)
		}
		tw.flush()
		for _, r := range h.Capacity {
			if r.Name == h.Resource {
				fmt.Fprintf(w, "%s now: capacity %d, allocatable %d.\n", r.Name, r.Capacity, r.Allocatable)
			}
		}
	}

	heading() // restart
	if r := rep.Restart; r != nil {
		verified := "does NOT verify"
		if r.Checkpoint.ChecksumOK {
			verified = "verified"
		}
		fmt.Fprintf(w, "Stopped the manager. Its checkpoint: %d entries, %s format, checksum %d %s.\n",
			r.Checkpoint.Entries, r.Checkpoint.Format, r.Checkpoint.Checksum, verified)
		removed := "it removed the plugins' stale sockets"
		if !r.PluginSocketsRemoved {
			removed = "the plugins' sockets were still there"
		}
		fmt.Fprintf(w, "Started a new manager on the same directory: %s.\n", removed)
		fmt.Fprintf(w, "Before any plugin is back it knows %d of %d allocations, from the checkpoint alone:\n",
			r.RestoredBeforePlugins, len(r.Allocations))
		writeCapacity(w, r.CapacityBeforePlugins, nil)
		if r.PluginsRegistered {
			fmt.Fprintln(w, "The plugins restarted and registered again.")
		}
		tw = newAlignedTable(w)
		tw.row("POD", "CONTAINER", "RESOURCE", "BEFORE", "AFTER", "SAME")
		for _, a := range r.Allocations {
			tw.row(a.Pod, a.Container, a.Resource, strings.Join(a.Before, " "), strings.Join(a.After, " "), yesOrNo(a.Same))
		}
		tw.flush()
		fmt.Fprintf(w, "Run options after the restart are the same as at admission: %s.\n", yesOrNo(r.RunOptionsSame))
	}

	heading() // summary
	s := rep.Summary
	fmt.Fprintf(w, "Pods:       %d admitted (%s), %d refused (%s)\n",
		len(s.Admitted), strings.Join(s.Admitted, ", "), len(s.Refused), strings.Join(s.Refused, ", "))
	var alloc []string
	for _, a := range s.Allocated {
		alloc = append(alloc, fmt.Sprintf("%s %d of %d", a.Resource, a.Allocated, a.Capacity))
	}
	fmt.Fprintf(w, "Allocated:  %s\n", strings.Join(alloc, ", "))
	fmt.Fprintf(w, "Health:     %s turned unhealthy; pods notified: %s\n", s.UnhealthyDevice, strings.Join(s.NotifiedPods, ", "))
	fmt.Fprintf(w, "Restart:    %d of %d allocations restored from the checkpoint; run options unchanged: %s\n",
		s.Restored, s.Allocations, yesOrNo(s.RunOptionsSame))
	cleaned := "managers and plugins stopped, directory removed"
	if !s.CleanedUp {
		cleaned = "FAILED: " + rep.Dir + " may be left behind"
	}
	fmt.Fprintf(w, "Cleanup:    %s\n", cleaned)
}

// admissionNotes points out what the admission table shows: devices an init
// container handed back to its pod and a later container reused, and the
// devices a plugin's preferred allocation kept on one NUMA node.
func admissionNotes(rep *demoReport, numa map[string][]int64) []string {
	policy := map[string]string{}
	for _, p := range rep.Plugins {
		policy[p.Resource] = p.PreferredAllocationPolicy
	}
	var notes []string
	for _, p := range rep.Pods {
		for _, ic := range p.Containers {
			if ic.Kind != demoKindInit {
				continue
			}
			for _, c := range p.Containers {
				if c.Kind == demoKindInit {
					continue
				}
				for _, res := range slices.Sorted(maps.Keys(ic.Devices)) {
					for _, id := range ic.Devices[res] {
						if slices.Contains(c.Devices[res], id) {
							notes = append(notes, fmt.Sprintf("%s/%s reuses %s of init container %s: an init container's devices go back to its pod.",
								p.Name, c.Name, id, ic.Name))
						}
					}
				}
			}
		}
		for _, c := range p.Containers {
			for _, res := range slices.Sorted(maps.Keys(c.Devices)) {
				ids := c.Devices[res]
				if policy[res] == "" || len(ids) < 2 {
					continue
				}
				nodes := map[string]bool{}
				for _, id := range ids {
					nodes[demoJoinNUMA(numa[res+"/"+id])] = true
				}
				if len(nodes) == 1 {
					notes = append(notes, fmt.Sprintf("%s/%s got %s all on NUMA node %s: the plugin's preferred allocation (%s).",
						p.Name, c.Name, strings.Join(ids, " "), demoJoinNUMA(numa[res+"/"+ids[0]]), policy[res]))
				}
			}
		}
	}
	return notes
}

// writeCapacity prints one row per resource; with numaNodes, the free and
// allocated devices of each NUMA node too.
func writeCapacity(w io.Writer, resources []demoResource, numaNodes []int) {
	tw := newAlignedTable(w)
	header := []string{"RESOURCE", "CAPACITY", "ALLOCATABLE", "ALLOCATED", "FREE"}
	for _, n := range numaNodes {
		header = append(header, "NUMA "+strconv.Itoa(n))
	}
	if numaNodes == nil {
		header = append(header, "FROM")
	}
	tw.row(header...)
	for _, r := range resources {
		row := []string{r.Name, strconv.Itoa(r.Capacity), strconv.Itoa(r.Allocatable), strconv.Itoa(r.Allocated), strconv.Itoa(r.Free)}
		for _, n := range numaNodes {
			var ids []string
			for _, d := range r.Devices {
				if slices.Contains(d.NUMANodes, int64(n)) {
					ids = append(ids, d.ID)
				}
			}
			row = append(row, strings.Join(ids, " "))
		}
		if numaNodes == nil {
			from := "plugin"
			if r.RestoredFromCheckpoint {
				from = "checkpoint (plugin not back yet)"
			}
			row = append(row, from)
		}
		tw.row(row...)
	}
	tw.flush()
}

// demoNUMAIndex maps "resource/deviceID" to the device's NUMA nodes.
func demoNUMAIndex(resources []demoResource) map[string][]int64 {
	out := map[string][]int64{}
	for _, r := range resources {
		for _, d := range r.Devices {
			out[r.Name+"/"+d.ID] = d.NUMANodes
		}
	}
	return out
}

func yesOrNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func demoJoinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

func demoJoinNUMA(v []int64) string {
	if len(v) == 0 {
		return "none"
	}
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.FormatInt(n, 10)
	}
	return strings.Join(s, ",")
}
