package sanity

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/parser"
)

// The rules a container's Allocate response must meet, each with its name
// and a function that returns one message per violation.
const (
	ruleDeviceSpecs = "device specs with absolute paths and permissions of r, w, m"
	ruleEnvs        = "valid environment variable names"
	ruleCDI         = "CDI device names that parse (vendor/class=name)"
	ruleMounts      = "mounts with absolute paths"
)

type responseRule struct {
	name  string
	check func(*pluginapi.ContainerAllocateResponse) []string
}

var (
	deviceSpecsRule = responseRule{ruleDeviceSpecs, func(r *pluginapi.ContainerAllocateResponse) []string {
		var bad []string
		for _, d := range r.GetDevices() {
			perm := d.GetPermissions()
			if !path.IsAbs(d.GetContainerPath()) || !path.IsAbs(d.GetHostPath()) ||
				perm == "" || strings.Trim(perm, "rwm") != "" {
				bad = append(bad, fmt.Sprintf("DeviceSpec{ContainerPath: %q, HostPath: %q, Permissions: %q}",
					d.GetContainerPath(), d.GetHostPath(), perm))
			}
		}
		return bad
	}}
	envsRule = responseRule{ruleEnvs, func(r *pluginapi.ContainerAllocateResponse) []string {
		var bad []string
		for _, name := range slices.Sorted(maps.Keys(r.GetEnvs())) {
			if errs := validation.IsEnvVarName(name); len(errs) > 0 {
				bad = append(bad, fmt.Sprintf("Envs[%q]: %s", name, strings.Join(errs, "; ")))
			}
		}
		return bad
	}}
	cdiRule = responseRule{ruleCDI, func(r *pluginapi.ContainerAllocateResponse) []string {
		var bad []string
		for _, d := range r.GetCdiDevices() {
			if _, _, _, err := parser.ParseQualifiedName(d.GetName()); err != nil {
				bad = append(bad, fmt.Sprintf("CDIDevice{Name: %q}: %v", d.GetName(), err))
			}
		}
		return bad
	}}
	mountsRule = responseRule{ruleMounts, func(r *pluginapi.ContainerAllocateResponse) []string {
		var bad []string
		for _, m := range r.GetMounts() {
			if !path.IsAbs(m.GetContainerPath()) || !path.IsAbs(m.GetHostPath()) {
				bad = append(bad, fmt.Sprintf("Mount{ContainerPath: %q, HostPath: %q}", m.GetContainerPath(), m.GetHostPath()))
			}
		}
		return bad
	}}
	responseRules = []responseRule{deviceSpecsRule, envsRule, cdiRule, mountsRule}
)

// listViolations returns what breaks the rules of a device list in the i-th
// ListAndWatch message: of its IDs, its health values, its topology.
func listViolations(i int, m *pluginapi.ListAndWatchResponse, numa []int) (ids, health, topology []string) {
	seen := map[string]bool{}
	for _, d := range m.GetDevices() {
		switch {
		case d.GetID() == "":
			ids = append(ids, fmt.Sprintf("list %d has a device with an empty ID", i+1))
		case seen[d.GetID()]:
			ids = append(ids, fmt.Sprintf("list %d has device %q twice", i+1, d.GetID()))
		}
		seen[d.GetID()] = true
		if h := d.GetHealth(); h != pluginapi.Healthy && h != pluginapi.Unhealthy {
			health = append(health, fmt.Sprintf("list %d: device %q has health %q", i+1, d.GetID(), h))
		}
		for _, n := range d.GetTopology().GetNodes() {
			if !slices.Contains(numa, int(n.GetID())) {
				topology = append(topology, fmt.Sprintf("list %d: device %q names NUMA node %d; this machine has %v",
					i+1, d.GetID(), n.GetID(), numa))
			}
		}
	}
	return ids, health, topology
}
