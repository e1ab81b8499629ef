package main

import (
	"slices"

	"github.com/openkubelet/devmgr/devicemanager"
)

// demoReport is everything the demo shows: the text output renders it, and
// --json prints it as one document.
type demoReport struct {
	Dir       string         `json:"dir"`
	Steps     []string       `json:"steps"`
	NUMANodes []int          `json:"numaNodes"`
	Plugins   []demoPlugin   `json:"plugins"`
	Capacity  []demoResource `json:"capacity"`
	Pods      []demoPod      `json:"pods"`
	Health    *demoHealth    `json:"health"`
	Restart   *demoRestart   `json:"restart"`
	Summary   demoSummary    `json:"summary"`
}

// The demo's steps, in order: the text output's headings.
var demoSteps = []string{
	"Start a device manager",
	"Start two device plugins: capacity",
	"Admit the demo pods: devices per container",
	"Run options per container",
	"Turn an allocated device unhealthy: pod notified, device health",
	"Restart the device manager: allocations restored from the checkpoint",
	"Summary",
}

// demoPlugin is one fake plugin as the manager sees it.
type demoPlugin struct {
	Resource                        string `json:"resource"`
	Socket                          string `json:"socket"`
	Devices                         int    `json:"devices"`
	PreStartRequired                bool   `json:"preStartRequired"`
	GetPreferredAllocationAvailable bool   `json:"getPreferredAllocationAvailable"`
	PreferredAllocationPolicy       string `json:"preferredAllocationPolicy,omitempty"`
	CDI                             bool   `json:"cdi"`
	// PreStartCalls counts the PreStartContainer calls the plugin received
	// during admission.
	PreStartCalls int `json:"preStartCalls"`
}

// demoResource is one resource of devicemanager's Status.
type demoResource struct {
	Name                   string       `json:"name"`
	Capacity               int          `json:"capacity"`
	Allocatable            int          `json:"allocatable"`
	Allocated              int          `json:"allocated"`
	Free                   int          `json:"free"`
	RestoredFromCheckpoint bool         `json:"restoredFromCheckpoint"`
	Devices                []demoDevice `json:"devices"`
}

type demoDevice struct {
	ID        string  `json:"id"`
	NUMANodes []int64 `json:"numaNodes"`
	Health    string  `json:"health"`
	Allocated bool    `json:"allocated"`
}

func demoResources(st []devicemanager.ResourceStatus) []demoResource {
	out := make([]demoResource, 0, len(st))
	for _, rs := range st {
		r := demoResource{
			Name: rs.Name, Capacity: rs.Capacity, Allocatable: rs.Allocatable,
			Allocated: rs.Allocated, Free: rs.Free, RestoredFromCheckpoint: rs.RestoredFromCheckpoint,
			Devices: make([]demoDevice, 0, len(rs.Devices)),
		}
		for _, d := range rs.Devices {
			r.Devices = append(r.Devices, demoDevice{
				ID: d.ID, NUMANodes: slices.Clone(d.NUMANodes), Health: d.Health, Allocated: d.Allocated,
			})
		}
		out = append(out, r)
	}
	return out
}

// demoPod is the admission of one pod manifest.
type demoPod struct {
	File       string          `json:"file"`
	Name       string          `json:"name"`
	Namespace  string          `json:"namespace"`
	UID        string          `json:"uid"`
	Admitted   bool            `json:"admitted"`
	Error      string          `json:"error,omitempty"`
	Containers []demoContainer `json:"containers"`
}

// demoContainer is what one container got.
type demoContainer struct {
	Name string `json:"name"`
	Kind string `json:"kind"` // init, sidecar or app
	// Devices maps each resource to the container's sorted device IDs.
	Devices    map[string][]string `json:"devices"`
	RunOptions *demoRunOptions     `json:"runOptions"`
}

// demoRunOptions is devicemanager.DeviceRunContainerOptions in JSON.
type demoRunOptions struct {
	Envs        []demoNameValue  `json:"envs"`
	Mounts      []demoMount      `json:"mounts"`
	Devices     []demoDeviceNode `json:"devices"`
	Annotations []demoNameValue  `json:"annotations"`
	CDIDevices  []string         `json:"cdiDevices"`
}

type demoNameValue struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type demoMount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly"`
}

type demoDeviceNode struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	Permissions   string `json:"permissions"`
}

func newDemoRunOptions(o *devicemanager.DeviceRunContainerOptions) *demoRunOptions {
	if o == nil {
		return nil
	}
	out := &demoRunOptions{
		Envs:        make([]demoNameValue, 0, len(o.Envs)),
		Mounts:      make([]demoMount, 0, len(o.Mounts)),
		Devices:     make([]demoDeviceNode, 0, len(o.Devices)),
		Annotations: make([]demoNameValue, 0, len(o.Annotations)),
		CDIDevices:  make([]string, 0, len(o.CDIDevices)),
	}
	for _, e := range o.Envs {
		out.Envs = append(out.Envs, demoNameValue{Name: e.Name, Value: e.Value})
	}
	for _, m := range o.Mounts {
		out.Mounts = append(out.Mounts, demoMount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
	}
	for _, d := range o.Devices {
		out.Devices = append(out.Devices, demoDeviceNode{ContainerPath: d.PathInContainer, HostPath: d.PathOnHost, Permissions: d.Permissions})
	}
	for _, a := range o.Annotations {
		out.Annotations = append(out.Annotations, demoNameValue{Name: a.Name, Value: a.Value})
	}
	for _, c := range o.CDIDevices {
		out.CDIDevices = append(out.CDIDevices, c.Name)
	}
	return out
}

// demoHealth is the health step: which device turned unhealthy, which pods
// the manager named on Updates(), and the allocated devices' health as
// UpdateAllocatedResourcesStatus reports it.
type demoHealth struct {
	Resource        string             `json:"resource"`
	Device          string             `json:"device"`
	NotifiedPods    []string           `json:"notifiedPods"`
	NotifiedPodUIDs []string           `json:"notifiedPodUIDs"`
	Containers      []demoDeviceHealth `json:"containers"`
	Capacity        []demoResource     `json:"capacity"`
}

// demoDeviceHealth is one device of a container's allocated resources status.
type demoDeviceHealth struct {
	Pod       string `json:"pod"`
	Container string `json:"container"`
	Resource  string `json:"resource"`
	Device    string `json:"device"`
	Health    string `json:"health"`
}

// demoRestart is the restart step.
type demoRestart struct {
	Checkpoint demoCheckpointInfo `json:"checkpoint"`
	// PluginSocketsRemoved: the new manager's Start removed the plugins'
	// sockets, so the plugins had to restart and register again.
	PluginSocketsRemoved bool `json:"pluginSocketsRemoved"`
	// RestoredBeforePlugins counts allocations the new manager knew, from
	// the checkpoint alone, before any plugin registered again.
	RestoredBeforePlugins int                `json:"restoredBeforePlugins"`
	CapacityBeforePlugins []demoResource     `json:"capacityBeforePlugins"`
	PluginsRegistered     bool               `json:"pluginsRegistered"`
	Allocations           []demoRestoredItem `json:"allocations"`
	RunOptionsSame        bool               `json:"runOptionsSame"`
	AllSame               bool               `json:"allSame"`
}

// demoCheckpointInfo describes the checkpoint file the stopped manager left.
type demoCheckpointInfo struct {
	File       string `json:"file"`
	Format     string `json:"format"`
	Checksum   uint64 `json:"checksum"`
	ChecksumOK bool   `json:"checksumOK"`
	Entries    int    `json:"entries"`
}

// demoRestoredItem compares one allocation before and after the restart.
type demoRestoredItem struct {
	Pod       string   `json:"pod"`
	Container string   `json:"container"`
	Resource  string   `json:"resource"`
	Before    []string `json:"before"`
	After     []string `json:"after"`
	Same      bool     `json:"same"`
}

// demoSummary is the last step.
type demoSummary struct {
	Admitted        []string         `json:"admitted"`
	Refused         []string         `json:"refused"`
	Allocated       []demoAllocCount `json:"allocated"`
	UnhealthyDevice string           `json:"unhealthyDevice"`
	NotifiedPods    []string         `json:"notifiedPods"`
	Restored        int              `json:"restored"`
	Allocations     int              `json:"allocations"`
	RunOptionsSame  bool             `json:"runOptionsSame"`
	CleanedUp       bool             `json:"cleanedUp"`
}

type demoAllocCount struct {
	Resource  string `json:"resource"`
	Allocated int    `json:"allocated"`
	Capacity  int    `json:"capacity"`
}
