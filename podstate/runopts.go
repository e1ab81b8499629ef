package podstate

import (
	"fmt"
	"maps"
	"slices"
)

// RunOptions is what a container needs from its device plugins, merged over
// the resources it holds (devicemanager.DeviceRunContainerOptions).
type RunOptions struct {
	Envs        []EnvVar
	Mounts      []Mount
	Devices     []DeviceInfo
	Annotations []Annotation
	CDIDevices  []CDIDevice
}

// EnvVar is one environment variable.
type EnvVar struct{ Name, Value string }

// Mount is one bind mount. Name is the container path; SELinuxRelabel is
// always false for device-plugin mounts.
type Mount struct {
	Name, ContainerPath, HostPath string
	ReadOnly, SELinuxRelabel      bool
}

// DeviceInfo is one device node to create in the container.
type DeviceInfo struct{ PathOnHost, PathInContainer, Permissions string }

// Annotation is one container annotation.
type Annotation struct{ Name, Value string }

// CDIDevice is one fully qualified CDI device name.
type CDIDevice struct{ Name string }

// Conflict reports a setting that two plugin responses (or one response
// twice) give different values; the first value was kept.
type Conflict struct {
	Kind     string // "env", "device", "mount" or "annotation"
	Key      string // env or annotation name; container path for devices and mounts
	Resource string // resource whose response gave the dropped value
	Kept     string // value in effect (host path for devices and mounts)
	Dropped  string // value ignored
}

// String describes the conflict for a log line.
func (c Conflict) String() string {
	return fmt.Sprintf("%s %q from resource %q: value %q ignored, %q kept",
		c.Kind, c.Key, c.Resource, c.Dropped, c.Kept)
}

// RunOptions merges the responses recorded for the container: resources in
// sorted order; within a response envs and annotations in sorted key order,
// devices, mounts and CDI devices in response order. The first value for an
// env name, annotation name, device or mount container path, or CDI name wins;
// a later different value is reported in conflicts (an equal one is dropped
// silently). Records without a response are skipped. An unknown pod or
// container yields nil, nil.
func (l *Ledger) RunOptions(podUID, containerName string) (*RunOptions, []Conflict) {
	recs, ok := l.pods[podUID][containerName]
	if !ok {
		return nil, nil
	}
	m := merger{opts: &RunOptions{}, seen: make(map[[2]string]string)}
	for _, res := range slices.Sorted(maps.Keys(recs)) {
		if resp := recs[res].resp; resp != nil {
			m.resource = res
			for _, k := range slices.Sorted(maps.Keys(resp.Envs)) {
				if m.first("env", k, resp.Envs[k]) {
					m.opts.Envs = append(m.opts.Envs, EnvVar{Name: k, Value: resp.Envs[k]})
				}
			}
			for _, d := range resp.Devices {
				if m.first("device", d.GetContainerPath(), d.GetHostPath()) {
					m.opts.Devices = append(m.opts.Devices, DeviceInfo{
						PathOnHost:      d.GetHostPath(),
						PathInContainer: d.GetContainerPath(),
						Permissions:     d.GetPermissions(),
					})
				}
			}
			for _, mnt := range resp.Mounts {
				if m.first("mount", mnt.GetContainerPath(), mnt.GetHostPath()) {
					m.opts.Mounts = append(m.opts.Mounts, Mount{
						Name:          mnt.GetContainerPath(),
						ContainerPath: mnt.GetContainerPath(),
						HostPath:      mnt.GetHostPath(),
						ReadOnly:      mnt.GetReadOnly(),
					})
				}
			}
			for _, k := range slices.Sorted(maps.Keys(resp.Annotations)) {
				if m.first("annotation", k, resp.Annotations[k]) {
					m.opts.Annotations = append(m.opts.Annotations, Annotation{Name: k, Value: resp.Annotations[k]})
				}
			}
			for _, c := range resp.CdiDevices {
				// A CDI name has no value, so it never conflicts.
				if m.first("cdi", c.GetName(), "") {
					m.opts.CDIDevices = append(m.opts.CDIDevices, CDIDevice{Name: c.GetName()})
				}
			}
		}
	}
	return m.opts, m.conflicts
}

// merger holds the first value seen per kind and key while RunOptions merges.
type merger struct {
	opts      *RunOptions
	resource  string
	seen      map[[2]string]string // {kind, key} -> first value
	conflicts []Conflict
}

// first reports whether key is new for kind, recording value; a known key
// with a different value is recorded as a conflict.
func (m *merger) first(kind, key, value string) bool {
	kept, ok := m.seen[[2]string{kind, key}]
	if !ok {
		m.seen[[2]string{kind, key}] = value
		return true
	}
	if kept != value {
		m.conflicts = append(m.conflicts, Conflict{
			Kind: kind, Key: key, Resource: m.resource, Kept: kept, Dropped: value,
		})
	}
	return false
}
